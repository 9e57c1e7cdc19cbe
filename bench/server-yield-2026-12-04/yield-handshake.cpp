// The end of llama-server's server_queue::yield_to_queue, alone (the pinned tools/server/server-queue.cpp's pattern):
// the main thread wakes the queue's worker, works W us, then waits for the worker to acknowledge the end of the yield.
// Prints the median and p90 of that wait over 400 yields for W = 0, 500, 4000 us.
//   g++ -O2 -pthread yield-handshake.cpp -o yh && ./yh
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

static std::mutex m;
static std::condition_variable cv_worker, cv_tasks;
static bool busy = false, yielding = false, stop = false;

static void worker() {
    for (;;) {
        {
            std::unique_lock<std::mutex> l(m);
            cv_worker.wait(l, [] { return stop || busy; });
            if (stop) {
                return;
            }
        }
        {
            std::unique_lock<std::mutex> l(m);
            cv_tasks.wait(l, [] { return stop || !yielding; });
            busy = false;
        }
        cv_tasks.notify_all();
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
    std::thread t(worker);
    for (int w : {0, 500, 4000}) {
        std::vector<double> v;
        for (int i = 0; i < 400; ++i) {
            {
                std::unique_lock<std::mutex> l(m);
                busy = yielding = true;
            }
            cv_worker.notify_one();
            const double t0 = now_us();
            while (now_us() - t0 < w) {
            }
            const double t1 = now_us();
            {
                std::unique_lock<std::mutex> l(m);
                yielding = false;
                cv_tasks.notify_all();
                cv_tasks.wait(l, [] { return !busy; });
            }
            v.push_back(now_us() - t1);
        }
        std::sort(v.begin(), v.end());
        printf("work %d us: end-of-yield wait median %.1f us, p90 %.1f us\n", w, v[v.size()/2], v[v.size()*9/10]);
    }
    {
        std::unique_lock<std::mutex> l(m);
        stop = true;
    }
    cv_worker.notify_all();
    cv_tasks.notify_all();
    t.join();
}
