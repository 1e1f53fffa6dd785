//! The house in layers (issue 56): every `crate::` path in src/ runs down
//! the layer table or sideways within a layer, and no circle of imports
//! joins files of different folders.
//!
//! The table, top to bottom (docs/architecture.md says what lives in each
//! and what it may use):
//!
//! | layer | files |
//! |---|---|
//! | face | `lib.rs` |
//! | control | `manager.rs`, `settings.rs` |
//! | interfaces | `allocator.rs`, `split.rs`, `shared_vec/`, `c_heap.rs`, `c_heap/` |
//! | process | `process.rs`, `background.rs`, `fork_guard.rs`, `fork_guard/` |
//! | beneath MKL | `backing/mod.rs`, `hooks.rs`, `decay.rs`, `chunks.rs`, `block_cache*`, `medium*`, `slack.rs` |
//! | policies | `backing/`: `budget.rs`, `heap_trim.rs`, `huge_pages.rs`, `zeroing.rs`, `map_limit.rs`, `signals.rs` |
//! | ground | `env.rs`, `sys/`, `sync.rs`, `ffi.rs`, `ffi/`, `backing/`: `map.rs`, `map_windows.rs`, `valgrind.rs` |
//!
//! A path is read from the source text (comments dropped, `use` groups
//! expanded) and resolved to the file of its longest module prefix, the
//! crate root's re-exports (`block_cache`, `MklAllocator`, ...) followed.
//! The paths that still reach up are listed in [`KNOWN`], each with why:
//! the test fails on a new one (naming the file, the path and the two
//! layers) and on a listed one that is gone (so that the list only
//! shrinks). `checker_catches_a_planted_violation` plants one and a
//! circle in a made-up tree and checks both are reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, top first: a name and the files (a trailing `/`: a folder).
const LAYERS: &[(&str, &[&str])] = &[
    ("face", &["lib.rs"]),
    ("control", &["manager.rs", "settings.rs"]),
    (
        "interfaces",
        &[
            "allocator.rs",
            "split.rs",
            "shared_vec/",
            "c_heap.rs",
            "c_heap/",
        ],
    ),
    (
        "process",
        &[
            "process.rs",
            "background.rs",
            "fork_guard.rs",
            "fork_guard/",
        ],
    ),
    (
        "beneath MKL",
        &[
            "backing/mod.rs",
            "backing/hooks.rs",
            "backing/decay.rs",
            "backing/chunks.rs",
            "backing/block_cache.rs",
            "backing/block_cache/",
            "backing/medium.rs",
            "backing/medium/",
            "backing/slack.rs",
            "backing/miri_tests.rs",
        ],
    ),
    (
        "policies",
        &[
            "backing/budget.rs",
            "backing/heap_trim.rs",
            "backing/huge_pages.rs",
            "backing/zeroing.rs",
            "backing/map_limit.rs",
            "backing/signals.rs",
        ],
    ),
    (
        "ground",
        &[
            "env.rs",
            "sys/",
            "sync.rs",
            "ffi.rs",
            "ffi/",
            "backing/map.rs",
            "backing/map_windows.rs",
            "backing/valgrind.rs",
        ],
    ),
];

/// The crate root's re-exports: a name at `crate::` and the module it is
/// in.
const ROOT_NAMES: &[(&str, &str)] = &[
    ("block_cache", "backing::block_cache"),
    ("huge_pages", "backing::huge_pages"),
    ("MklAllocator", "allocator"),
    ("MAX_ALIGN", "allocator"),
    ("MIN_ALIGN", "allocator"),
    ("MklSplitAllocator", "split"),
    ("DEFAULT_SPLIT_THRESHOLD", "split"),
    ("SPLIT_MAX_SMALL_ALIGN", "split"),
    ("SharedMklVec", "shared_vec"),
    ("SharedVecError", "shared_vec"),
    ("View", "shared_vec"),
    ("ViewMut", "shared_vec"),
    ("ArcView", "shared_vec"),
    ("Export", "shared_vec"),
    ("Mutant", "shared_vec"),
    ("Cache", "backing::block_cache::shards"),
    ("Chunk", "backing::chunks"),
    ("ChunkTable", "backing::chunks"),
    ("chunk_home", "backing::chunks"),
    ("Bin", "c_heap::bin"),
];

/// Paths allowed to reach up (file, path, why): none. The list is kept so
/// that a reach up that must stay a while is named here with its reason,
/// never silent.
const KNOWN: &[(&str, &str, &str)] = &[];

/// The layer of `file` (relative to src/), by the table.
fn layer(layers: &[(&str, &[&str])], file: &str) -> Option<usize> {
    layers.iter().position(|(_, files)| {
        files
            .iter()
            .any(|f| *f == file || (f.ends_with('/') && file.starts_with(f)))
    })
}

/// The source text without comments (line comments, doc comments and
/// block comments; string contents are kept, which is harmless here: no
/// string of src/ holds `crate::` followed by a path).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The paths a `crate::` at the start of `s` names: one, or a `use`
/// group's expanded (`crate::{a, b::{c, d}}`: `a`, `b::c`, `b::d`).
fn paths_at(s: &str) -> Vec<Vec<String>> {
    fn ident(s: &[u8], i: &mut usize) -> Option<String> {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
            *i += 1;
        }
        (*i > start).then(|| String::from_utf8_lossy(&s[start..*i]).into_owned())
    }
    fn skip_ws(s: &[u8], i: &mut usize) {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn tree(s: &[u8], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut cur = prefix.to_vec();
        loop {
            skip_ws(s, i);
            if *i < s.len() && s[*i] == b'{' {
                *i += 1;
                loop {
                    tree(s, i, &cur, out);
                    skip_ws(s, i);
                    if *i < s.len() && s[*i] == b',' {
                        *i += 1;
                        skip_ws(s, i);
                    }
                    if *i >= s.len() || s[*i] == b'}' {
                        *i += 1;
                        return;
                    }
                }
            }
            match ident(s, i) {
                Some(id) => {
                    if id != "self" {
                        cur.push(id);
                    }
                }
                None => break,
            }
            if s[*i..].starts_with(b"::") {
                *i += 2;
                continue;
            }
            break;
        }
        out.push(cur);
    }
    let mut out = Vec::new();
    let mut i = 0;
    tree(s.as_bytes(), &mut i, &[], &mut out);
    out
}

/// The file a path resolves to: that of its longest module prefix.
fn resolve(
    modules: &BTreeMap<Vec<String>, String>,
    root_names: &[(&str, &str)],
    path: &[String],
) -> Option<String> {
    let mut full: Vec<String> = path.to_vec();
    if let Some((_, module)) = root_names
        .iter()
        .find(|(n, _)| Some(*n) == path.first().map(|s| s.as_str()))
    {
        full = module
            .split("::")
            .map(String::from)
            .chain(path[1..].iter().cloned())
            .collect();
    }
    (0..=full.len())
        .rev()
        .find_map(|n| modules.get(&full[..n]).cloned())
}

/// A reach up: (file, path, its layer, the target's layer).
type Violation = (String, String, &'static str, &'static str);

/// A link: (file, path, the file it resolves to).
type Link = (String, String, String);

/// Checks `files` (path relative to src/, text): the paths that reach up,
/// every link between files, and the files in no layer.
fn check(
    layers: &[(&'static str, &[&str])],
    root_names: &[(&str, &str)],
    files: &BTreeMap<String, String>,
) -> (BTreeSet<Violation>, BTreeSet<Link>, Vec<String>) {
    let mut modules = BTreeMap::new();
    for f in files.keys() {
        let mut m: Vec<String> = f
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        if m.last().is_some_and(|s| s == "mod") {
            m.pop();
        }
        if m == ["lib"] {
            m.clear();
        }
        modules.insert(m, f.clone());
    }
    let mut unplaced = Vec::new();
    let mut up = BTreeSet::new();
    let mut links = BTreeSet::new();
    for (f, text) in files {
        let Some(from) = layer(layers, f) else {
            unplaced.push(f.clone());
            continue;
        };
        let text = strip_comments(text);
        for (at, _) in text.match_indices("crate::") {
            // A `crate::` inside an identifier (`$crate::`) is a macro's.
            if text[..at].ends_with('$') {
                continue;
            }
            let rest = &text[at + "crate::".len()..];
            for path in paths_at(&rest[..rest.len().min(600)]) {
                let Some(to_file) = resolve(&modules, root_names, &path) else {
                    continue;
                };
                if &to_file == f {
                    continue;
                }
                let shown = format!("crate::{}", path.join("::"));
                if let Some(to) = layer(layers, &to_file) {
                    if to < from {
                        up.insert((f.clone(), shown.clone(), layers[from].0, layers[to].0));
                    }
                }
                links.insert((f.clone(), shown, to_file));
            }
        }
    }
    (up, links, unplaced)
}

/// The links as a graph, less those `skip` names (file, path).
fn graph(
    links: &BTreeSet<Link>,
    skip: &BTreeSet<(&str, &str)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (f, p, t) in links {
        if !skip.contains(&(f.as_str(), p.as_str())) {
            g.entry(f.clone()).or_default().insert(t.clone());
        }
    }
    g
}

/// The strongly connected sets of files (Tarjan) that span folders.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(w);
                    set.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                let folders: BTreeSet<&str> = set
                    .iter()
                    .map(|f| f.rsplit_once('/').map_or("", |(d, _)| d))
                    .collect();
                if set.len() > 1 && folders.len() > 1 {
                    set.sort();
                    self.out.push(set);
                }
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// src/'s files, relative paths and texts.
fn sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

#[test]
fn no_module_reaches_up_beyond_the_known_list() {
    let (up, _, unplaced) = check(LAYERS, ROOT_NAMES, &sources());
    assert!(
        unplaced.is_empty(),
        "files in no layer (add them to LAYERS): {unplaced:?}"
    );
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(f, p, _)| (*f, *p)).collect();
    let new: Vec<String> = up
        .iter()
        .filter(|(f, p, _, _)| !known.contains(&(f.as_str(), p.as_str())))
        .map(|(f, p, a, b)| format!("{f}: `{p}` reaches up from {a} to {b}"))
        .collect();
    assert!(
        new.is_empty(),
        "new imports that reach up:\n{}",
        new.join("\n")
    );
    let gone: Vec<String> = known
        .iter()
        .filter(|(f, p)| !up.iter().any(|(g, q, _, _)| g == f && q == p))
        .map(|(f, p)| format!("{f}: `{p}`"))
        .collect();
    assert!(
        gone.is_empty(),
        "no longer reaching up (remove them from KNOWN):\n{}",
        gone.join("\n")
    );
}

/// Every circle of imports across folders today goes through a known
/// reach up: without those links the graph of files has none. A new
/// circle (two sideways imports that meet, or a new reach up) fails here.
#[test]
fn no_circle_beyond_the_known_reaches() {
    let (_, links, _) = check(LAYERS, ROOT_NAMES, &sources());
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().map(|(f, p, _)| (*f, *p)).collect();
    let found = circles(&graph(&links, &known));
    assert!(
        found.is_empty(),
        "circles of imports across folders: {found:#?}"
    );
}

#[test]
fn checker_catches_a_planted_violation() {
    // A made-up crate: `low.rs` (ground) reaches up into `high.rs`
    // (interfaces), which imports it: a reach up and a circle.
    const PLANTED: &[(&str, &[&str])] = &[
        ("face", &["lib.rs"]),
        ("interfaces", &["high.rs", "high/"]),
        ("ground", &["low/"]),
    ];
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod high; mod low;"),
        (
            "high.rs",
            "use crate::low::thing::{self, f};\n// crate::nothing here\n",
        ),
        (
            "low/thing.rs",
            "/* crate::high::hidden */ fn g() { crate::high::H.get(); }",
        ),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let (up, links, unplaced) = check(PLANTED, &[], &files);
    assert!(unplaced.is_empty());
    let circles = circles(&graph(&links, &BTreeSet::new()));
    let up: Vec<_> = up.into_iter().collect();
    assert_eq!(
        up,
        [(
            "low/thing.rs".to_string(),
            "crate::high::H".to_string(),
            "ground",
            "interfaces"
        )],
        "the planted reach up (and not the commented one)"
    );
    assert_eq!(
        circles,
        [["high.rs".to_string(), "low/thing.rs".to_string()]]
    );
    // And the real tree's table places every file of src/.
    assert!(check(LAYERS, ROOT_NAMES, &sources()).2.is_empty());
}
