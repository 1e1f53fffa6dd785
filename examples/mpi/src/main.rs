//! MKL memory as MPI buffers, from Rust: rsmpi (the `mpi` crate) over MPICH.
//!
//! ```sh
//! cd examples/mpi && cargo build --release
//! mpiexec -n 4 target/release/mkl-alloc-mpi-example
//! ```
//!
//! (or `bash scripts/mpi-check.sh` from the repository root, which installs
//! MPICH and libclang where missing, builds this and counts the ranks' `ok`).
//!
//! What it shows, each part checked on every rank:
//!
//! 1. `MklSplitAllocator` as the global allocator: every buffer of 4 KiB or
//!    more in the program, rsmpi's own included, is MKL memory aligned to 64
//!    bytes; small objects stay with the system allocator.
//! 2. Collectives over `Vec<f64, MklAllocator>` (allocator-api2's `Vec`):
//!    allreduce, broadcast into it, gather. MPI reads and writes the MKL
//!    block in place: no copy, no staging buffer.
//! 3. A `SharedMklVec<f64>` shared by the threads of a rank while a view of
//!    it is the buffer of non-blocking operations (an immediate allreduce
//!    and an immediate send; a mutable view receives). Another thread's
//!    resize is refused while the views live and goes through once they are
//!    dropped. Since a request borrows its buffer, the view cannot be
//!    dropped before the request completes: the borrow checker, not the
//!    programmer's care, keeps MPI's buffer from being freed under it.
//! 4. Point to point between ranks: MKL buffers of 64 B to 8 MiB sent round
//!    a ring, checked for alignment and content on arrival (8 MiB twice:
//!    with mkl-alloc's block cache on, `MKL_ALLOC_BLOCK_CACHE=on`, the
//!    second round gets the first round's blocks back), and a message
//!    received into a `Vec` that rsmpi allocates (through the global
//!    allocator: MKL memory again).
//!
//! Every rank asserts; any failure prints what was expected and what
//! arrived, then aborts the whole job (`MPI_Abort`), so `mpiexec` exits
//! non-zero. Each rank prints `rank N: ok` last.

use std::alloc::Layout;
use std::sync::mpsc;
use std::thread;

use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, SharedVecError};
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::point_to_point::send_receive_into;
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;

/// Small blocks from the system allocator, every block of 4 KiB or more (or
/// aligned to more than 16) from MKL, aligned to 64 bytes. MPICH keeps its
/// own allocations with libc's `malloc`; that is unaffected.
#[global_allocator]
static GLOBAL: MklSplitAllocator = MklSplitAllocator;

/// A `Vec` whose block is MKL's, whatever the global allocator.
type MklVec<T> = allocator_api2::vec::Vec<T, MklAllocator>;

/// `f64`s per rank in the collectives: 512 KiB, MKL memory either way.
const N: usize = 1 << 16;

/// MKL's alignment: every `MklAllocator` block, and every MKL block of the
/// split allocator, starts on a 64-byte boundary (a cache line, an AVX-512
/// register).
const ALIGN: usize = 64;

fn main() {
    // FUNNELED: only this (the main) thread calls MPI; the threads that
    // share the SharedMklVec below never do.
    let (universe, threading) = mpi::initialize_with_threading(Threading::Funneled)
        .expect("MPI_Init_thread(MPI_THREAD_FUNNELED): MPI was already initialised");
    assert!(
        threading >= Threading::Funneled,
        "MPI_Init_thread: asked for MPI_THREAD_FUNNELED, the MPI library provides only {threading:?}"
    );
    abort_job_on_panic();

    let world = universe.world();
    let rank = world.rank();
    assert_eq!(
        world.size(),
        4,
        "rank {rank}: run on 4 ranks (mpiexec -n 4); the checks expect 4"
    );

    global_allocator(rank);
    collectives(&world);
    shared_vec_in_nonblocking_requests(&world);
    point_to_point(&world);

    println!("rank {rank}: ok");
    // `universe` drops here: MPI_Finalize.
}

/// Without this, a panic unwinds through `universe`, whose drop finalises
/// MPI, and the other ranks wait in their next collective for ever (tried:
/// they spun until `mpiexec`'s timeout). `MPI_Abort` ends every rank at
/// once instead, before any unwinding. Only the main thread calls MPI
/// (FUNNELED); a worker thread's panic reaches it when `thread::scope`
/// joins the worker, or as a closed channel.
fn abort_job_on_panic() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        if thread::current().name() == Some("main") {
            SimpleCommunicator::world().abort(1);
        }
    }));
}

/// `len` zeros in MKL memory.
fn zeros(len: usize) -> MklVec<f64> {
    let mut v = MklVec::with_capacity_in(len, MklAllocator);
    v.resize(len, 0.0);
    v
}

/// `len` values `value(i)` in MKL memory.
fn mkl_vec(len: usize, value: impl Fn(usize) -> f64) -> MklVec<f64> {
    let mut v = MklVec::with_capacity_in(len, MklAllocator);
    v.extend((0..len).map(value));
    v
}

/// Panics, naming the rank, the buffer and the first wrong element, unless
/// `got[i] == want(i)` for every `i` (all values here are small integers or
/// halves: exact in `f64`, so exact comparison is right).
fn expect_values(rank: Rank, what: &str, got: &[f64], want: impl Fn(usize) -> f64) {
    if let Some((i, &g)) = got.iter().enumerate().find(|&(i, &g)| g != want(i)) {
        panic!(
            "rank {rank}: {what}: element {i} of {} is {g}, expected {}",
            got.len(),
            want(i)
        );
    }
}

/// Panics unless `ptr` is on a 64-byte boundary.
fn expect_aligned(rank: Rank, what: &str, ptr: *const f64) {
    assert!(
        ptr as usize % ALIGN == 0,
        "rank {rank}: {what}: buffer at {ptr:p} is not {ALIGN}-byte aligned"
    );
}

/// Part 1: The global allocator: large `std::vec::Vec`s are MKL blocks too.
fn global_allocator(rank: Rank) {
    let plain = vec![0.0f64; N];
    let layout = Layout::array::<f64>(N).expect("a layout of N f64s");
    assert!(
        GLOBAL.is_mkl(layout),
        "rank {rank}: MklSplitAllocator should serve {} bytes from MKL",
        layout.size()
    );
    expect_aligned(rank, "vec![0.0; N] under MklSplitAllocator", plain.as_ptr());
}

/// Part 2: Blocking collectives over `Vec<f64, MklAllocator>`. rsmpi's buffer
/// traits are implemented for slices (and std's `Vec`), so an allocator-api2
/// `Vec` goes in as `&v[..]` / `&mut v[..]`: MPI gets the MKL block's address.
fn collectives(world: &SimpleCommunicator) {
    let rank = world.rank();
    let size = world.size();
    let r = f64::from(rank);

    // Allreduce: every rank gets the element-wise sum. Rank r sends
    // i * (r + 1), so the sum is i * (1 + 2 + ... + size).
    let send = mkl_vec(N, |i| i as f64 * (r + 1.0));
    let mut sum = zeros(N);
    let at = sum.as_ptr();
    world.all_reduce_into(&send[..], &mut sum[..], SystemOperation::sum());
    let triangle = f64::from(size * (size + 1) / 2);
    expect_values(rank, "allreduce into Vec<f64, MklAllocator>", &sum, |i| {
        i as f64 * triangle
    });
    assert_eq!(
        sum.as_ptr(),
        at,
        "rank {rank}: MPI writes in place: the block must not move"
    );
    expect_aligned(rank, "allreduce result", sum.as_ptr());

    // Broadcast into a Vec<f64, MklAllocator>: rank 0's values everywhere.
    let root = world.process_at_rank(0);
    let pattern = |i: usize| (i % 1000) as f64 * 0.5 + 7.0;
    let mut shared = if rank == 0 {
        mkl_vec(N, pattern)
    } else {
        zeros(N)
    };
    root.broadcast_into(&mut shared[..]);
    expect_values(
        rank,
        "broadcast into Vec<f64, MklAllocator>",
        &shared,
        pattern,
    );

    // Gather: rank 0 receives every rank's slice, in rank order, into one
    // MKL buffer; the others only send.
    const PART: usize = 4096;
    let mine = mkl_vec(PART, |i| r * 1e6 + i as f64);
    if rank == 0 {
        let mut all = zeros(PART * size as usize);
        root.gather_into_root(&mine[..], &mut all[..]);
        expect_values(rank, "gather into Vec<f64, MklAllocator>", &all, |i| {
            (i / PART) as f64 * 1e6 + (i % PART) as f64
        });
        expect_aligned(rank, "gather result", all.as_ptr());
        println!("rank 0: allreduce, broadcast, gather over Vec<f64, MklAllocator>: checked");
    } else {
        root.gather_into(&mine[..]);
    }
}

/// A request to the resizing thread: resize `vec` to `len` elements, and
/// answer with what `try_resize` returned.
type ResizeRequest<'v> = (&'v SharedMklVec<f64>, usize);

/// Part 3: A `SharedMklVec` in non-blocking requests while another thread of the
/// rank tries to resize it through `&self`.
fn shared_vec_in_nonblocking_requests(world: &SimpleCommunicator) {
    let rank = world.rank();
    let size = world.size();
    let r = f64::from(rank);
    let next = world.process_at_rank((rank + 1) % size);
    let prev_rank = (rank + size - 1) % size;
    let prev = world.process_at_rank(prev_rank);

    // What this rank sends (read by MPI through a shared view) and where it
    // receives its neighbour's (written by MPI through a mutable view).
    let outbox = SharedMklVec::from_slice(&mkl_vec(N, |i| r * 1e6 + i as f64));
    let inbox = SharedMklVec::from_slice(&zeros(N));
    let mut total = zeros(N);

    thread::scope(|threads| {
        // The other thread: it holds only `&SharedMklVec` and resizes on
        // request, reporting what the resize returned.
        let (ask, asked) = mpsc::channel::<ResizeRequest<'_>>();
        let (answer, answers) = mpsc::channel::<Result<(), SharedVecError>>();
        threads.spawn(move || {
            for (vec, len) in asked {
                // Grows or shrinks through `&self`; refused, not blocked,
                // while any view lives.
                let result = vec.try_resize(len, -1.0);
                if answer.send(result).is_err() {
                    break;
                }
            }
        });
        let resize = |vec, len| {
            ask.send((vec, len))
                .expect("the resizing thread stopped (it panicked: see above)");
            answers
                .recv()
                .expect("the resizing thread stopped (it panicked: see above)")
        };

        // A shared view (read-only, counted) and a mutable view (exclusive).
        let out_view = outbox
            .view()
            .expect("a view of the outbox: nothing else holds it");
        let mut in_view = inbox
            .try_view_mut()
            .expect("a mutable view of the inbox: nothing else holds it");

        mpi::request::scope(|scope| {
            // The shared view is the send buffer of two requests at once
            // (MPI allows concurrent reads of a send buffer); the mutable
            // view is a receive buffer.
            let sum = world.immediate_all_reduce_into(
                scope,
                &out_view[..],
                &mut total[..],
                SystemOperation::sum(),
            );
            let sent = next.immediate_send(scope, &out_view[..]);
            let received = prev.immediate_receive_into(scope, &mut in_view[..]);

            // While the requests are pending, another thread tries to
            // resize both buffers. A resize would free the block MPI is
            // reading or writing; instead it is refused at once.
            assert_eq!(
                resize(&outbox, 2 * N),
                Err(SharedVecError::Exported { views: 1 }),
                "rank {rank}: resizing the send buffer of pending requests must be refused"
            );
            assert_eq!(
                resize(&inbox, 2 * N),
                Err(SharedVecError::Busy),
                "rank {rank}: resizing the receive buffer of a pending request must be refused"
            );

            // `drop(out_view)` or `drop(in_view)` here does not compile:
            // the requests borrow them until they complete. And a request
            // must complete within its scope (rsmpi aborts otherwise).
            sum.wait();
            sent.wait();
            received.wait();
        });

        // The requests are complete, but the refusal comes from the views,
        // not from MPI: as long as they live, the buffers stay put.
        assert_eq!(
            resize(&outbox, 2 * N),
            Err(SharedVecError::Exported { views: 1 }),
            "rank {rank}: resizing while the view lives must be refused"
        );
        expect_values(rank, "immediate receive into a ViewMut", &in_view, |i| {
            f64::from(prev_rank) * 1e6 + i as f64
        });

        drop(out_view);
        drop(in_view);
        assert_eq!(
            resize(&outbox, 2 * N),
            Ok(()),
            "rank {rank}: resizing the outbox after its view was dropped"
        );
        assert_eq!(
            resize(&inbox, 2 * N),
            Ok(()),
            "rank {rank}: resizing the inbox after its mutable view was dropped"
        );
        // Dropping `ask` ends the resizing thread's loop; the scope joins it.
    });

    // The immediate allreduce summed r * 1e6 + i over the ranks.
    let ranks = f64::from(size * (size - 1) / 2);
    expect_values(rank, "immediate allreduce from a View", &total, |i| {
        ranks * 1e6 + f64::from(size) * i as f64
    });
    // The resizes kept the contents and filled the new tail.
    let outbox = outbox
        .view()
        .expect("a view of the outbox after the resize");
    let inbox = inbox.view().expect("a view of the inbox after the resize");
    expect_values(rank, "outbox after resize", &outbox, |i| {
        if i < N { r * 1e6 + i as f64 } else { -1.0 }
    });
    expect_values(rank, "inbox after resize", &inbox, |i| {
        if i < N {
            f64::from(prev_rank) * 1e6 + i as f64
        } else {
            -1.0
        }
    });
    expect_aligned(rank, "outbox after resize", outbox.as_ptr());
    expect_aligned(rank, "inbox after resize", inbox.as_ptr());
    if rank == 0 {
        println!(
            "rank 0: SharedMklVec views as buffers of pending requests: resizes refused, then done"
        );
    }
}

/// Part 4: Point to point: MKL buffers round a ring (rank r sends to r + 1 and
/// receives from r - 1 in one `MPI_Sendrecv`, so nobody waits on anybody).
fn point_to_point(world: &SimpleCommunicator) {
    let rank = world.rank();
    let size = world.size();
    let next = world.process_at_rank((rank + 1) % size);
    let prev_rank = (rank + size - 1) % size;
    let prev = world.process_at_rank(prev_rank);
    let value = |from: Rank, i: usize| f64::from(from) * 1e6 + (i % 100_000) as f64;

    // One cache line, a size MPICH sends eagerly, and 8 MiB (rendezvous:
    // MPI reads the sender's block while the receiver's is written) twice.
    // With mkl-alloc's block cache on, the second 8 MiB round gets the
    // first round's blocks back, still mapped: whatever the MPI library
    // registered for them (UCX, libfabric) is still valid (docs/mpi.md).
    let mut big_blocks = [[0usize; 2]; 2];
    for (round, len) in [8, 1000, 1 << 20, 1 << 20].into_iter().enumerate() {
        let send = mkl_vec(len, |i| value(rank, i));
        let mut recv = zeros(len);
        expect_aligned(rank, "send buffer", send.as_ptr());
        if len == 1 << 20 {
            big_blocks[round - 2] = [send.as_ptr() as usize, recv.as_ptr() as usize];
        }
        let status = send_receive_into(&send[..], &next, &mut recv[..], &prev);
        assert_eq!(
            status.source_rank(),
            prev_rank,
            "rank {rank}: message of {len} f64s came from the wrong rank"
        );
        assert_eq!(
            status.count(f64::equivalent_datatype()) as usize,
            len,
            "rank {rank}: message from rank {prev_rank}: wrong element count"
        );
        expect_aligned(rank, "receive buffer", recv.as_ptr());
        expect_values(
            rank,
            &format!("{len} f64s from rank {prev_rank}"),
            &recv,
            |i| value(prev_rank, i),
        );
    }

    if rank == 0 {
        let reused = big_blocks[1]
            .iter()
            .filter(|a| big_blocks[0].contains(a))
            .count();
        match mkl_alloc::block_cache::budget() {
            Some(bytes) => println!(
                "rank 0: block cache on ({} MiB): the second 8 MiB round reused {reused} of 2 blocks",
                bytes >> 20
            ),
            None => println!("rank 0: block cache off"),
        }
    }

    // A message of unknown length: rsmpi probes it and allocates the `Vec`
    // on arrival with the global allocator, i.e. MklSplitAllocator, which
    // serves 64 KiB from MKL: the block arrives 64-byte aligned.
    let len = 8192;
    let send = mkl_vec(len, |i| value(rank, i));
    let (received, status) = mpi::request::scope(|scope| {
        let sent = next.immediate_send(scope, &send[..]);
        let received = prev.receive_vec::<f64>();
        sent.wait();
        received
    });
    assert_eq!(status.source_rank(), prev_rank);
    expect_aligned(rank, "Vec allocated by receive_vec", received.as_ptr());
    expect_values(rank, "receive_vec from the previous rank", &received, |i| {
        value(prev_rank, i)
    });
    if rank == 0 {
        println!(
            "rank 0: point to point, 64 B to 8 MiB of MKL memory round the ring: aligned and intact"
        );
    }
}
