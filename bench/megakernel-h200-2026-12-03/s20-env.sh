# session 20's device calls share one build (megakernel/device.sh's, with llama-server for the e2e stage): sourced by
# s20-call*.sh
export MK_TARGETS="llama-bench llama-server"
export MK_MODELS="small-f16 e4b-mtp"
W=/tmp/stq-mk; B=$W/build/bin; M=$W/models
