//! The whole-program workload (`workload/common.rs`) with
//! `mkl_alloc::MklSplitAllocator<mimalloc::MiMalloc>` (the split over mimalloc) as the global
//! allocator. Run through `cargo run --release --example perf`, or alone:
//! `cargo run --release --example workload_split_mimalloc -- 1000000 mixed`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: mkl_alloc::MklSplitAllocator<mimalloc::MiMalloc> =
    mkl_alloc::MklSplitAllocator::over(mimalloc::MiMalloc);

fn main() {
    common::main_for("MklSplitAllocator<MiMalloc>");
}
