//! A whole test binary whose `#[global_allocator]` is the split over
//! mimalloc (the checks: `split_global_checks`).

mod split_global_checks;

use mkl_alloc::MklSplitAllocator;
use split_global_checks::Counting;

#[global_allocator]
static GLOBAL: MklSplitAllocator<Counting<mimalloc::MiMalloc>> =
    MklSplitAllocator::over(Counting(mimalloc::MiMalloc));

fn main() {
    split_global_checks::run("split_global_mimalloc");
}
