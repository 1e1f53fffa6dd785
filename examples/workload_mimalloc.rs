//! The whole-program workload (`workload/common.rs`) with `mimalloc::MiMalloc` as the
//! global allocator. Run through `cargo run --release --example perf`, or
//! alone: `cargo run --release --example workload_mimalloc -- 1000000`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    common::main_for("mimalloc");
}
