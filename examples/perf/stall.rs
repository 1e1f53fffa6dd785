//! Group 8 (issue 10's cost of huge pages): each measurement in a fresh
//! child process (`perf --child stall on|off <state>`, where `<state>` is
//! fresh, after-free or fragmented).

use std::hint::black_box;
use std::time::Instant;

use mkl_alloc::MklAllocator;

use crate::harness::{Env, Series, child, field, ms, order};
use crate::huge::{HP_OFF, HP_ON};
use crate::report::Table;
use crate::support::*;

/// The block the stall children allocate and touch.
/// The block the stall children allocate and touch.
const STALL_BYTES: usize = 256 << 20;

/// Child of `huge_stall_group`: prepares the machine state `pre` names,
/// then allocates and touches one MKL block of STALL_BYTES with huge
/// pages `on` or off; prints its thread CPU time and wall time.
pub fn stall_child(on: bool, pre: &str) {
    let page = 4096;
    // Anonymous memory in 4 KiB pages (MADV_NOHUGEPAGE, whatever THP says).
    let map = |bytes: usize| -> *mut u8 {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap of {bytes} bytes failed");
        // SAFETY: the mapping just made; the advice changes no contents.
        unsafe { libc::madvise(p, bytes, libc::MADV_NOHUGEPAGE) };
        let p = p.cast::<u8>();
        for off in (0..bytes).step_by(page) {
            // SAFETY: inside the mapping.
            unsafe { p.add(off).write(1) };
        }
        p
    };
    let mut keep: Option<(*mut u8, usize)> = None;
    match pre {
        "fresh" => {}
        // 512 MiB of 4 KiB pages touched and unmapped just before.
        "after-free" => {
            let b = 512 << 20;
            let p = map(b);
            // SAFETY: the whole mapping made above, not used again.
            unsafe { libc::munmap(p.cast(), b) };
        }
        // 1 GiB of 4 KiB pages with every other page given back: 512 MiB
        // stays resident, spread over every 2 MiB frame it touched.
        "fragmented" => {
            let b = 1 << 30;
            let p = map(b);
            for off in (0..b).step_by(2 * page) {
                // SAFETY: one page inside the mapping; its contents are not
                // needed again.
                unsafe { libc::madvise(p.add(off).cast(), page, libc::MADV_DONTNEED) };
            }
            keep = Some((p, b));
        }
        other => panic!("unknown stall preparation {other}"),
    }
    set_huge_pages(on);
    let wall = Instant::now();
    let cpu = ms(|| {
        black_box(first_touch(&MklAllocator, STALL_BYTES, false));
    });
    let wall = wall.elapsed().as_secs_f64() * 1e3;
    if let Some((p, b)) = keep {
        // SAFETY: the mapping made above, not used again.
        unsafe { libc::munmap(p.cast(), b) };
    }
    println!("cpu_ms={cpu} wall_ms={wall}");
}

/// Issue 10, the cost: the slowest single allocation + first touch of a
/// 256 MiB MKL block among N fresh processes, huge pages off and on, in
/// three machine states (fresh; right after 512 MiB of 4 KiB pages were
/// freed; with 512 MiB of 4 KiB pages scattered over 1 GiB of frames).
pub fn huge_stall_group(t: &mut Table) {
    const N: usize = 6;
    let pres = ["fresh", "after-free", "fragmented"];
    // [pre][off, on] -> (cpu, wall) per child
    let mut cells: Vec<[(Series, Series); 2]> = pres
        .iter()
        .map(|_| {
            [false, true].map(|on| {
                let n = if on { HP_ON } else { HP_OFF };
                (Series::new(n), Series::new(n))
            })
        })
        .collect();
    for r in 0..N {
        for i in order(2 * pres.len(), r) {
            let (p, on) = (i / 2, i % 2 == 1);
            // The child sets its huge-page policy itself and touches one
            // block: the block cache, on or off, plays no part.
            let args = ["stall", if on { "on" } else { "off" }, pres[p]].map(String::from);
            let f = child(Env::Defaults, &args);
            cells[p][on as usize].0.values.push(field(&f, "cpu_ms"));
            cells[p][on as usize].1.values.push(field(&f, "wall_ms"));
        }
    }
    let max = |s: &Series| s.values.iter().copied().fold(0.0, f64::max);
    for (p, cell) in pres.iter().zip(&cells) {
        for (clock, pick) in [("CPU", 0), ("wall", 1)] {
            let [off, on] = cell;
            let (off, on) = if pick == 0 {
                (&off.0, &on.0)
            } else {
                (&off.1, &on.1)
            };
            let title = format!("8. alloc+touch 256 MiB in a fresh process, {p}, {clock} time");
            t.group(
                &format!("{title}, median of {N}"),
                "ms",
                &[off.clone(), on.clone()],
                0,
            );
            let slowest = format!("{title}, slowest of {N}");
            t.row(&slowest, &off.name, max(off), "ms", 1.0, &off.name);
            t.row(
                &slowest,
                &on.name,
                max(on),
                "ms",
                max(on) / max(off),
                &off.name,
            );
        }
    }
}
