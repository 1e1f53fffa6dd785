//! A whole test binary whose `#[global_allocator]` is the split over
//! `System` (the checks: `split_global_checks`; the same over mimalloc and
//! jemalloc: `split_global_mimalloc.rs`, `split_global_jemalloc.rs`).

mod split_global_checks;

use mkl_alloc::MklSplitAllocator;
use split_global_checks::Counting;

#[global_allocator]
static GLOBAL: MklSplitAllocator<Counting<std::alloc::System>> =
    MklSplitAllocator::over(Counting(std::alloc::System));

fn main() {
    split_global_checks::run("split_global");
}
