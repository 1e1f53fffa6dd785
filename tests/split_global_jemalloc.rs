//! A whole test binary whose `#[global_allocator]` is the split over
//! jemalloc (the checks: `split_global_checks`; jemalloc builds on Unix
//! only, so elsewhere the binary is empty).

#[cfg(unix)]
mod split_global_checks;

#[cfg(unix)]
#[global_allocator]
static GLOBAL: mkl_alloc::MklSplitAllocator<
    split_global_checks::Counting<tikv_jemallocator::Jemalloc>,
> = mkl_alloc::MklSplitAllocator::over(split_global_checks::Counting(tikv_jemallocator::Jemalloc));

fn main() {
    #[cfg(unix)]
    split_global_checks::run("split_global_jemalloc");
}
