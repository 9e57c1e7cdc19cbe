#!/usr/bin/env bash
# Session 41, call E (warm, after s40-callA.sh's build and the 7 receive calls of the real Gemma 3 270M): where a small
# model's phases spend their time across the grid, not only in block 0. LLAMA_MEGAKERNEL_PROFILE=2 adds, per phase, the
# first, mean and last block's arrival at the barrier after the phase began, and the release lag: the last arrival is the
# phase's critical path. 48 one-token steps (device.sh stage profile).
#   run(command="bash bench/megakernel-h200-2026-12-06/s41-callE.sh", carry=[".dev/cuda"], timeout_s=300)
MK_MODELS=gemma3 MK_PROF=2 MK_PROF_LINES=80 bash megakernel/device.sh profile
