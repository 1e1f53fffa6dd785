//! Groups 6, 7, 7b and 9, in this process: the huge-page and block-cache
//! policies switched through the API (`huge_pages::enable`,
//! `block_cache::enable`), each competitor with its policy set explicitly
//! and the policies found restored after it.

use std::hint::black_box;

use mkl_alloc::{MklAllocator, block_cache, huge_pages};

use crate::harness::{Series, interleave, interleave_multi, ms, order};
use crate::report::Table;
use crate::support::*;

/// The policies in force when a competitor starts, restored after it, so
/// that no group leaves its settings to the next one (the library's
/// defaults, or what `MKL_ALLOC_*` asked for, hold between groups).
struct Policies {
    cache: Option<usize>,
    hp: Option<usize>,
}

impl Policies {
    fn save() -> Self {
        Self {
            cache: block_cache::budget(),
            hp: huge_pages::threshold(),
        }
    }

    /// Empties the cache and sets both policies back.
    fn restore(self) {
        block_cache::disable();
        if let Some(b) = self.cache {
            block_cache::enable(b);
        }
        match self.hp {
            Some(t) => huge_pages::enable(t),
            None => huge_pages::disable(),
        }
    }
}

/// Runs `f` with the block cache off and the huge-page policy `on` (2 MiB
/// threshold) or off, then restores the policies found.
fn with_hp(on: bool, f: impl FnOnce() -> f64) -> f64 {
    with_cfg(false, on, f)
}

/// As [`with_hp`], for a run that returns several values.
fn with_hp_multi(on: bool, f: impl FnOnce() -> Vec<f64>) -> Vec<f64> {
    let saved = Policies::save();
    block_cache::disable();
    set_huge_pages(on);
    let v = f();
    saved.restore();
    v
}

pub const HP_OFF: &str = "MklAllocator, huge pages off";
pub const HP_ON: &str = "MklAllocator, huge pages on";

/// `Vec<f64, A>` pushed to `n` (`name`: "10^7"; `row`: the table's row
/// number), System and mimalloc beside MklAllocator with huge pages off and
/// on; the target of issue 10.
fn huge_growth(t: &mut Table, rounds: usize, n: usize, row: &str, name: &str) {
    let series = interleave(
        rounds,
        &mut [
            ("Vec<f64, System>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(std::alloc::System), n));
                })
            }),
            ("Vec<f64, MklAllocator>, huge pages off", &mut || {
                with_hp(false, || {
                    ms(|| {
                        black_box(vec_growth(MklAllocator, n));
                    })
                })
            }),
            ("Vec<f64, MklAllocator>, huge pages on", &mut || {
                with_hp(true, || {
                    ms(|| {
                        black_box(vec_growth(MklAllocator, n));
                    })
                })
            }),
            ("Vec<f64, mimalloc>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(mimalloc::MiMalloc), n));
                })
            }),
            ("Vec<f64, jemalloc>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(tikv_jemallocator::Jemalloc), n));
                })
            }),
        ],
    );
    t.group(&format!("{row} Vec<f64> push to {name}"), "ms", &series, 0);
    t.target(
        &format!("MklAllocator + huge pages ≤ 0.8x System, Vec push {name}"),
        &series[2],
        &series[0],
        0.8,
    );
}

/// Runs `f` with the block cache (default budget) and the huge-page policy
/// (2 MiB threshold) as given, then restores the policies found; the cache
/// is emptied before and after, so each run starts cold and leaves nothing
/// behind for the next one.
fn with_cfg(cache: bool, hp: bool, f: impl FnOnce() -> f64) -> f64 {
    let saved = Policies::save();
    block_cache::disable();
    if cache {
        block_cache::enable(block_cache::default_budget());
    }
    set_huge_pages(hp);
    let v = f();
    saved.restore();
    v
}

/// Issue 15: the block cache, switched through the API in this process.
/// Each MKL competitor runs plain (cache and huge pages off), with the
/// cache (the one issue 15's targets measure), and with the cache and
/// huge pages; every run starts with an empty cache. Issue 21's rows for
/// the library's defaults are the `config` groups (child processes).
pub fn block_cache_group(t: &mut Table) {
    const B: usize = 64 << 20;
    const PLAIN: &str = "MklAllocator, no cache, no huge pages";
    const CACHE: &str = "MklAllocator + block cache";
    const BOTH: &str = "MklAllocator + block cache + huge pages";
    let temporaries = |a: &dyn Fn() -> f64| -> f64 {
        ms(|| {
            (0..8).for_each(|_| {
                black_box(a());
            })
        })
    };
    let series = interleave(
        11,
        &mut [
            ("System", &mut || {
                temporaries(&|| first_touch(&ViaGlobal(std::alloc::System), B, false))
            }),
            (PLAIN, &mut || {
                with_cfg(false, false, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            (CACHE, &mut || {
                with_cfg(true, false, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            (BOTH, &mut || {
                with_cfg(true, true, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            ("mimalloc", &mut || {
                temporaries(&|| first_touch(&ViaGlobal(mimalloc::MiMalloc), B, false))
            }),
            ("jemalloc", &mut || {
                temporaries(&|| first_touch(&ViaGlobal(tikv_jemallocator::Jemalloc), B, false))
            }),
        ],
    );
    t.group(
        "9. 64 MiB temporaries, 8 per round (alloc, write all, free)",
        "ms",
        &series,
        0,
    );
    t.target(
        "block cache ≤ 0.5x System, 64 MiB temporaries",
        &series[2],
        &series[0],
        0.5,
    );

    // Growth as a program's loop does it: the push is timed the second
    // time round, after one untimed push and drop (every allocator warm).
    for (n, name, rounds, limit) in [(10_000_000, "10^7", 11, 0.8), (100_000_000, "10^8", 5, 1.0)] {
        let twice = |grow: &dyn Fn() -> f64| -> f64 {
            black_box(grow());
            ms(|| {
                black_box(grow());
            })
        };
        let series = interleave(
            rounds,
            &mut [
                ("Vec<f64, System>", &mut || {
                    twice(&|| vec_growth(ViaGlobal(std::alloc::System), n))
                }),
                (PLAIN, &mut || {
                    with_cfg(false, false, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                (CACHE, &mut || {
                    with_cfg(true, false, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                (BOTH, &mut || {
                    with_cfg(true, true, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                ("Vec<f64, mimalloc>", &mut || {
                    twice(&|| vec_growth(ViaGlobal(mimalloc::MiMalloc), n))
                }),
                ("Vec<f64, jemalloc>", &mut || {
                    twice(&|| vec_growth(ViaGlobal(tikv_jemallocator::Jemalloc), n))
                }),
            ],
        );
        t.group(
            &format!("9. Vec<f64> push to {name}, the second time"),
            "ms",
            &series,
            0,
        );
        t.target(
            &format!("block cache ≤ {limit:.1}x System, Vec push to {name} (second time)"),
            &series[2],
            &series[0],
            limit,
        );
    }
}

/// Issue 10, steady state: growth to 10^7 and first touch of 64 MiB, each
/// MKL competitor with huge pages off and on.
pub fn huge_pages_group(t: &mut Table) {
    const N: usize = 10_000_000;
    huge_growth(t, 11, N, "6.", "10^7");
    let series = interleave(
        11,
        &mut [
            ("Vec<f64>::push (System)", &mut || {
                ms(|| {
                    black_box(std_vec_growth(N));
                })
            }),
            ("SharedMklVec::try_push, huge pages off", &mut || {
                with_hp(false, || {
                    ms(|| {
                        black_box(shared_try_push(N));
                    })
                })
            }),
            ("SharedMklVec::try_push, huge pages on", &mut || {
                with_hp(true, || {
                    ms(|| {
                        black_box(shared_try_push(N));
                    })
                })
            }),
        ],
    );
    t.group("6. push to 10^7 f64", "ms", &series, 0);
    const B: usize = 64 << 20;
    for zeroed in [false, true] {
        let series = interleave(
            15,
            &mut [
                ("System", &mut || {
                    ms(|| {
                        black_box(first_touch(&ViaGlobal(std::alloc::System), B, zeroed));
                    })
                }),
                (HP_OFF, &mut || {
                    with_hp(false, || {
                        ms(|| {
                            black_box(first_touch(&MklAllocator, B, zeroed));
                        })
                    })
                }),
                (HP_ON, &mut || {
                    with_hp(true, || {
                        ms(|| {
                            black_box(first_touch(&MklAllocator, B, zeroed));
                        })
                    })
                }),
                ("mimalloc", &mut || {
                    ms(|| {
                        black_box(first_touch(&ViaGlobal(mimalloc::MiMalloc), B, zeroed));
                    })
                }),
                ("jemalloc", &mut || {
                    ms(|| {
                        black_box(first_touch(
                            &ViaGlobal(tikv_jemallocator::Jemalloc),
                            B,
                            zeroed,
                        ));
                    })
                }),
            ],
        );
        let how = if zeroed {
            "alloc_zeroed + write (vec![0.0; n], filled)"
        } else {
            "alloc + write"
        };
        t.group(&format!("6. first touch 64 MiB, {how}"), "ms", &series, 1);
        t.target(
            &format!("huge pages on ≥ 3x faster than off, first touch 64 MiB, {how}"),
            &series[2],
            &series[1],
            1.0 / 3.0,
        );
    }
}

/// Issue 10, the large rows: growth to 10^8, and 1 GiB blocks: first touch
/// (alloc + write, alloc_zeroed + write), a TLB-bound gather and a
/// streaming daxpy over memory already touched. About a minute.
pub fn huge_1gib_group(t: &mut Table) {
    const N: usize = 100_000_000;
    huge_growth(t, 3, N, "7.", "10^8");
    const B: usize = 1 << 30;
    const READS: usize = 20_000_000;
    fn run<A: allocator_api2::alloc::Allocator + Copy>(a: A) -> Vec<f64> {
        let touch = ms(|| {
            black_box(first_touch(&a, B, false));
        });
        let touch_zeroed = ms(|| {
            black_box(first_touch(&a, B, true));
        });
        let mut block = Filled::new(a, B / 8);
        let g = ms(|| {
            black_box(gather(block.as_mut_slice(), READS));
        });
        let d = ms(|| {
            black_box(daxpy_halves(block.as_mut_slice(), 0.5));
        });
        vec![touch, touch_zeroed, g, d]
    }
    let m = interleave_multi(
        4,
        4,
        true,
        &mut [
            ("System", &mut || run(ViaGlobal(std::alloc::System))),
            (HP_OFF, &mut || with_hp_multi(false, || run(MklAllocator))),
            (HP_ON, &mut || with_hp_multi(true, || run(MklAllocator))),
            ("mimalloc", &mut || run(&ViaGlobal(mimalloc::MiMalloc))),
            ("jemalloc", &mut || {
                run(ViaGlobal(tikv_jemallocator::Jemalloc))
            }),
        ],
    );
    let titles = [
        "7. first touch 1 GiB, alloc + write",
        "7. first touch 1 GiB, alloc_zeroed + write",
        "7. gather 2·10^7 random f64 over 1 GiB",
        "7. daxpy over 1 GiB (y += a·x, 512 MiB each)",
    ];
    for (title, series) in titles.iter().zip(&m) {
        t.group(title, "ms", series, 1);
    }
    for (i, title) in titles[..2].iter().enumerate() {
        t.target(
            &format!("huge pages on ≥ 3x faster than off, {}", &title[3..]),
            &m[i][2],
            &m[i][1],
            1.0 / 3.0,
        );
    }
}

/// Issue 10, why the 1 GiB first touch is slow with huge pages on this
/// machine: the same 1 GiB block allocated + written right after an equal
/// block was freed, and after a 5 s pause (in which a VM with free page
/// reporting hands the freed 2 MiB frames back to the host). Alternating
/// off / on, 3 rounds of (pause, then two back-to-back blocks); about 40 s.
pub fn huge_reuse_group(t: &mut Table) {
    const B: usize = 1 << 30;
    const ROUNDS: usize = 3;
    let names = [HP_OFF, HP_ON];
    let mut after_pause: Vec<Series> = names.iter().map(|n| Series::new(n)).collect();
    let mut back_to_back: Vec<Series> = names.iter().map(|n| Series::new(n)).collect();
    let touch = |on: bool| {
        with_hp(on, || {
            ms(|| {
                black_box(first_touch(&MklAllocator, B, false));
            })
        })
    };
    for r in 0..ROUNDS {
        for i in order(2, r) {
            std::thread::sleep(std::time::Duration::from_secs(5));
            after_pause[i].values.push(touch(i == 1));
            let a = touch(i == 1);
            let b = touch(i == 1);
            back_to_back[i].values.push(a.max(b));
        }
    }
    t.group(
        "7b. first touch 1 GiB after a 5 s pause",
        "ms",
        &after_pause,
        0,
    );
    t.group(
        "7b. first touch 1 GiB right after freeing 1 GiB (slower of two)",
        "ms",
        &back_to_back,
        0,
    );
}
