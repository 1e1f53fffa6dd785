//! The criterion settings every bench shares: short runs by default (the
//! machine is small and shared), criterion's full runs and the largest
//! inputs with `MKL_ALLOC_BENCH_LONG=1`.

use std::time::Duration;

use criterion::Criterion;

/// Whether `MKL_ALLOC_BENCH_LONG` asks for full runs.
pub fn long() -> bool {
    std::env::var_os("MKL_ALLOC_BENCH_LONG").is_some()
}

/// Criterion's defaults in a long run; otherwise 10 samples after `warm_up`,
/// measured for `measure`.
pub fn criterion(warm_up: Duration, measure: Duration) -> Criterion {
    if long() {
        Criterion::default()
    } else {
        Criterion::default()
            .sample_size(10)
            .warm_up_time(warm_up)
            .measurement_time(measure)
    }
}
