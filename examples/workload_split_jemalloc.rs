//! The whole-program workload (`workload/common.rs`) with
//! `mkl_alloc::MklSplitAllocator<tikv_jemallocator::Jemalloc>` (the split over jemalloc) as the global
//! allocator. Run through `cargo run --release --example perf`, or alone:
//! `cargo run --release --example workload_split_jemalloc -- 1000000 mixed`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: mkl_alloc::MklSplitAllocator<tikv_jemallocator::Jemalloc> =
    mkl_alloc::MklSplitAllocator::over(tikv_jemallocator::Jemalloc);

fn main() {
    common::main_for("MklSplitAllocator<Jemalloc>");
}
