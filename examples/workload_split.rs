//! The whole-program workload (`workload/common.rs`) with `mkl_alloc::MklSplitAllocator` as the
//! global allocator. Run through `cargo run --release --example perf`, or
//! alone: `cargo run --release --example workload_split -- 1000000`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: mkl_alloc::MklSplitAllocator = mkl_alloc::MklSplitAllocator;

fn main() {
    common::main_for("MklSplitAllocator");
}
