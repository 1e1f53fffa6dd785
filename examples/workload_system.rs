//! The whole-program workload (`workload/common.rs`) with `std::alloc::System` as the
//! global allocator. Run through `cargo run --release --example perf`, or
//! alone: `cargo run --release --example workload_system -- 1000000`.

#[path = "workload/common.rs"]
mod common;

#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

fn main() {
    common::main_for("System");
}
