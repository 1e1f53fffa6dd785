//! The whole-program workload (`workload/common.rs`) with `tikv_jemallocator::Jemalloc` as the
//! global allocator. Run through `cargo run --release --example perf`, or
//! alone: `cargo run --release --example workload_jemalloc -- 1000000`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    common::main_for("jemalloc");
}
