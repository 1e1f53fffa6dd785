//! The whole-program workload (`workload/common.rs`) with `mkl_alloc::MklAllocator` as the
//! global allocator. Run through `cargo run --release --example perf`, or
//! alone: `cargo run --release --example workload_mkl -- 1000000`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: mkl_alloc::MklAllocator = mkl_alloc::MklAllocator;

fn main() {
    common::main_for("MklAllocator");
}
