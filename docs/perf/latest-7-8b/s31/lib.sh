# helpers for the device calls: those of ../gqa/scripts/lib.sh (setup, clone, prof, bench, lcpp_start,
# peer), which the session's .h200/ab/lib.sh copied, and this one:
use() {     # use VARIANT: shaders/attention.wgsl <- .h200/ab/attention_VARIANT.wgsl, installed
  cp .h200/ab/attention_$1.wgsl shaders/attention.wgsl
  python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -1
}
