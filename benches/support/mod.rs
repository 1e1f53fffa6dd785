//! Kernels shared by the criterion benches (`benches/*.rs`) and the quick
//! `examples/perf/` (`cargo run --release --example perf`), so both
//! measure exactly the same code.
//!
//! Included with `#[path = ".../support/mod.rs"] mod support;`; each
//! includer uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_int;
use core::hint::black_box;
use core::ptr::{self, NonNull};

use allocator_api2::alloc::{AllocError, Allocator};
use mkl_alloc::ffi;

/// The block sizes of the alloc+free group.
pub const SIZES: [usize; 5] = [16, 256, 4096, 64 << 10, 1 << 20];
/// The alignment of the alloc+free group.
pub const ALIGN: usize = 64;

/// Human-readable size.
pub fn size_name(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// One `alloc` + `dealloc` of `layout` through a `GlobalAlloc`, `iters` times.
#[inline(never)]
pub fn alloc_free<A: GlobalAlloc>(a: &A, layout: Layout, iters: u64) {
    for _ in 0..iters {
        let l = black_box(layout);
        // SAFETY: the layouts used here are non-zero-sized.
        let p = unsafe { a.alloc(l) };
        black_box(p);
        // SAFETY: p was just allocated with `l`. The sizes benchmarked (at
        // most 1 MiB) never fail on the machines this runs on; the debug
        // build checks it.
        debug_assert!(!p.is_null());
        unsafe { a.dealloc(p, l) };
    }
}

/// One raw `MKL_malloc(size, align)` + `MKL_free`, `iters` times: the floor
/// `MklAllocator` is measured against.
#[inline(never)]
pub fn alloc_free_raw_mkl(layout: Layout, iters: u64) {
    for _ in 0..iters {
        let l = black_box(layout);
        // SAFETY: a positive size and a power-of-two alignment that fits a C int.
        let p = unsafe { ffi::MKL_malloc(l.size(), l.align() as c_int) };
        black_box(p);
        // SAFETY: p came from MKL_malloc and is freed once.
        unsafe { ffi::MKL_free(p) };
    }
}

/// An allocator-api2 `Allocator` over any `GlobalAlloc` (System, mimalloc),
/// so every competitor of the growth groups runs the same `Vec` code.
#[derive(Clone, Copy, Debug, Default)]
pub struct ViaGlobal<A>(pub A);

// SAFETY: every block comes from and returns to the wrapped GlobalAlloc with
// the layout it was allocated with; zero-sized layouts never reach it; the
// wrappers used here are zero-sized handles (System, MiMalloc), so copies of
// the handle are the same allocator.
unsafe impl<A: GlobalAlloc> Allocator for ViaGlobal<A> {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            let p = NonNull::new(ptr::without_provenance_mut::<u8>(layout.align()))
                .ok_or(AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        // SAFETY: non-zero size.
        let p = unsafe { self.0.alloc(layout) };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, layout.size()))
            .ok_or(AllocError)
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return self.allocate(layout);
        }
        // SAFETY: non-zero size. (calloc: what `vec![0.0; n]` asks for.)
        let p = unsafe { self.0.alloc_zeroed(layout) };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, layout.size()))
            .ok_or(AllocError)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: allocated by the wrapped allocator with `layout`.
            unsafe { self.0.dealloc(ptr.as_ptr(), layout) }
        }
    }

    #[inline]
    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        if old.size() == 0 || new.align() != old.align() {
            let fresh = self.allocate(new)?;
            // SAFETY: distinct blocks; the old one holds old.size() bytes and
            // is freed once after the copy.
            unsafe {
                ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.cast().as_ptr(), old.size());
                self.deallocate(ptr, old);
            }
            return Ok(fresh);
        }
        // SAFETY: a live non-empty block of `old`; new.size() >= old.size() > 0.
        let p = unsafe { self.0.realloc(ptr.as_ptr(), old, new.size()) };
        NonNull::new(p)
            .map(|p| NonNull::slice_from_raw_parts(p, new.size()))
            .ok_or(AllocError)
    }
}

/// allocator-api2 `Vec<f64, A>` pushed to `n` elements; returns a checksum.
#[inline(never)]
pub fn vec_growth<A: Allocator>(a: A, n: usize) -> f64 {
    let mut v: allocator_api2::vec::Vec<f64, A> = allocator_api2::vec::Vec::new_in(a);
    for i in 0..n {
        v.push(black_box(i as f64));
    }
    black_box(v.as_ptr());
    v[n / 2] + v[n - 1]
}

/// std `Vec<f64>` (the global allocator) pushed to `n` elements.
#[inline(never)]
pub fn std_vec_growth(n: usize) -> f64 {
    let mut v: Vec<f64> = Vec::new();
    for i in 0..n {
        v.push(black_box(i as f64));
    }
    black_box(v.as_ptr());
    v[n / 2] + v[n - 1]
}

/// The same growth as `vec_growth` (capacity 4, then doubling) by hand on
/// `MKL_malloc` / `MKL_realloc` / `MKL_free`: the floor for `Vec<f64, MklAllocator>`.
#[inline(never)]
// `len` mirrors `Vec::push`'s bookkeeping on purpose (same loop as `vec_growth`).
#[allow(clippy::explicit_counter_loop)]
pub fn raw_mkl_realloc_growth(n: usize) -> f64 {
    let mut cap = 0usize;
    let mut len = 0usize;
    let mut p: *mut f64 = ptr::null_mut();
    for i in 0..n {
        if len == cap {
            let new_cap = if cap == 0 { 4 } else { cap * 2 };
            // SAFETY: MKL_malloc/MKL_realloc take any positive size; p is
            // null or the live block from the previous round.
            let q: *mut f64 = unsafe {
                if p.is_null() {
                    ffi::MKL_malloc(new_cap * 8, 64)
                } else {
                    ffi::MKL_realloc(p.cast(), new_cap * 8)
                }
            }
            .cast();
            assert!(!q.is_null(), "MKL could not grow the buffer");
            p = q;
            cap = new_cap;
        }
        // SAFETY: len < cap, inside the live block.
        unsafe { p.add(len).write(black_box(i as f64)) };
        len += 1;
    }
    black_box(p);
    // SAFETY: n / 2 and n - 1 are below len; p is freed once.
    unsafe {
        let s = *p.add(n / 2) + *p.add(n - 1);
        ffi::MKL_free(p.cast());
        s
    }
}

/// A hashbrown map in allocator `A`, `n` inserts of scattered keys.
#[inline(never)]
pub fn hashbrown_insert<A: Allocator + Clone>(a: A, n: u64) -> usize {
    let mut m: hashbrown::HashMap<u64, u64, hashbrown::DefaultHashBuilder, A> =
        hashbrown::HashMap::with_hasher_in(Default::default(), a);
    for i in 0..n {
        m.insert(black_box(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), i);
    }
    black_box(m.len())
}

/// The same inserts into a default hashbrown map (the global allocator).
#[inline(never)]
pub fn hashbrown_insert_default(n: u64) -> usize {
    let mut m: hashbrown::HashMap<u64, u64> = hashbrown::HashMap::new();
    for i in 0..n {
        m.insert(black_box(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)), i);
    }
    black_box(m.len())
}

/// Acquire + release one shared view of a `SharedMklVec`, `iters` times.
#[inline(never)]
pub fn view_loop(v: &mkl_alloc::SharedMklVec<f64>, iters: u64) {
    for _ in 0..iters {
        if let Ok(g) = black_box(v).view() {
            black_box(&*g);
        }
    }
}

/// `Arc::clone` + drop, `iters` times.
#[inline(never)]
pub fn arc_loop(a: &std::sync::Arc<Vec<f64>>, iters: u64) {
    for _ in 0..iters {
        let c = std::sync::Arc::clone(black_box(a));
        black_box(&*c);
    }
}

/// `RwLock::try_read` + release, `iters` times.
#[inline(never)]
pub fn rwlock_loop(l: &std::sync::RwLock<Vec<f64>>, iters: u64) {
    for _ in 0..iters {
        if let Ok(g) = black_box(l).try_read() {
            black_box(&*g);
        }
    }
}

/// `AtomicRefCell::try_borrow` + release, `iters` times.
#[inline(never)]
pub fn atomic_refcell_loop(c: &atomic_refcell::AtomicRefCell<Vec<f64>>, iters: u64) {
    for _ in 0..iters {
        if let Ok(g) = black_box(c).try_borrow() {
            black_box(&*g);
        }
    }
}

/// Runs `f(iters)` on two threads at once (released together by a
/// barrier) and returns the mean per-thread wall time in nanoseconds.
pub fn two_threads(iters: u64, f: impl Fn(u64) + Sync) -> f64 {
    let barrier = std::sync::Barrier::new(2);
    let run = || {
        barrier.wait();
        let t = std::time::Instant::now();
        f(iters);
        t.elapsed().as_nanos() as f64
    };
    std::thread::scope(|s| {
        let other = s.spawn(run);
        let mine = run();
        (mine + other.join().unwrap()) / 2.0
    })
}

/// `SharedMklVec::try_push` from empty to `n` elements.
#[inline(never)]
pub fn shared_try_push(n: usize) -> usize {
    let v = mkl_alloc::SharedMklVec::<f64>::new();
    for i in 0..n {
        v.try_push(black_box(i as f64)).unwrap();
    }
    black_box(v.len())
}

/// Turns `mkl_alloc::huge_pages` on (blocks of 2 MiB and more) or off:
/// the one difference between the "huge pages on" and "off" competitors.
pub fn set_huge_pages(on: bool) {
    if on {
        mkl_alloc::huge_pages::enable(mkl_alloc::huge_pages::HUGE_PAGE_SIZE);
    } else {
        mkl_alloc::huge_pages::disable();
    }
}

/// A block of `bytes` (align 64, zeroed or not) from `a`, every f64 of it
/// written once (the first touch: one page fault per page), then freed.
/// `zeroed` is `vec![0.0f64; n]` then a fill; otherwise alloc + write.
#[inline(never)]
pub fn first_touch<A: Allocator>(a: &A, bytes: usize, zeroed: bool) -> f64 {
    let layout = Layout::from_size_align(bytes, 64).unwrap();
    let block = if zeroed {
        a.allocate_zeroed(layout)
    } else {
        a.allocate(layout)
    }
    .expect("first_touch: allocation failed");
    let p = block.cast::<f64>().as_ptr();
    let n = bytes / 8;
    // SAFETY: the block holds n f64s, 64-byte aligned; written before read;
    // freed once with its layout.
    unsafe {
        for i in 0..n {
            p.add(i).write(i as f64);
        }
        let s = black_box(*p.add(n / 2));
        a.deallocate(block.cast(), layout);
        s
    }
}

/// A live block of `n` f64s from `a`, written once (its first touch),
/// for the kernels that run over memory already faulted in.
pub struct Filled<A: Allocator> {
    alloc: A,
    ptr: NonNull<f64>,
    n: usize,
}

impl<A: Allocator> Filled<A> {
    /// Allocates and writes `n` f64s (align 64).
    pub fn new(alloc: A, n: usize) -> Self {
        let layout = Layout::array::<f64>(n).unwrap().align_to(64).unwrap();
        let ptr = alloc
            .allocate(layout)
            .expect("Filled: allocation failed")
            .cast::<f64>();
        // SAFETY: the block holds n f64s.
        unsafe {
            for i in 0..n {
                ptr.as_ptr().add(i).write((i % 1024) as f64);
            }
        }
        Self { alloc, ptr, n }
    }

    /// The contents.
    pub fn as_mut_slice(&mut self) -> &mut [f64] {
        // SAFETY: n initialised f64s, borrowed mutably through &mut self.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.n) }
    }
}

impl<A: Allocator> Drop for Filled<A> {
    fn drop(&mut self) {
        let layout = Layout::array::<f64>(self.n).unwrap().align_to(64).unwrap();
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { self.alloc.deallocate(self.ptr.cast(), layout) }
    }
}

/// `reads` dependent-free random reads (xorshift indices) over `xs`: bound
/// by TLB misses once `xs` is far larger than the TLB's reach.
#[inline(never)]
pub fn gather(xs: &[f64], reads: usize) -> f64 {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let n = xs.len() as u64;
    let mut s = 0.0;
    for _ in 0..reads {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s += xs[(x % n) as usize];
    }
    black_box(s)
}

/// `y += a * x` over the two halves of `xs` (a streaming pass over all of it).
#[inline(never)]
pub fn daxpy_halves(xs: &mut [f64], a: f64) -> f64 {
    let (x, y) = xs.split_at_mut(xs.len() / 2);
    for (yi, xi) in y.iter_mut().zip(x.iter()) {
        *yi += a * *xi;
    }
    black_box(y[y.len() / 2])
}

/// Median of a slice (sorted in place).
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}
