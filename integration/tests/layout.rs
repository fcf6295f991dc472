//! The product's layout rules, read from its sources: no two modules import each other, directly
//! or through others; no production file over 500 lines; no function over 80 lines in the
//! driver, webhook and scheduling crates. Tests (`*tests.rs`, `tests/`, inline `mod tests`) are
//! left out: they may reach anywhere.
//!
//! A module here is one file. An import is any `crate::`, `super::` or `self::` path in a `use`
//! item or in code, resolved to the deepest module it names; a path ending in an item of a
//! module (a type, a function, a re-export) imports that module's file.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose sources are product code.
const CRATES: &[&str] = &["proto", "cdi", "scheduling", "runtime", "driver", "webhook", "cli"];
/// The crates whose functions must stay short.
const SHORT_FUNCTIONS: &[&str] = &["driver", "webhook", "scheduling"];
const MAX_FILE_LINES: usize = 500;
const MAX_FN_LINES: usize = 80;

/// This workspace, or the checkout `LAYOUT_ROOT` names (to see what the checks say of another
/// commit).
fn workspace() -> PathBuf {
    match std::env::var_os("LAYOUT_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf(),
    }
}

/// One production source file: its module path (`plugin::api::source`) and its code with
/// comments and inline test modules taken out.
struct Source {
    file: PathBuf,
    module: Vec<String>,
    code: String,
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs") || name == "test_fixtures.rs" || name == "fixtures.rs"
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !is_test_file(&path) {
            out.push(path);
        }
    }
}

/// `src/lib.rs` and `src/main.rs` are the root, `src/a/mod.rs` and `src/a.rs` are `a`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code without comment lines and without `#[cfg(test)] mod tests { ... }` blocks.
fn production_code(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            out.push("");
            continue;
        }
        if trimmed == "#[cfg(test)]" {
            // A test module, inline or in its own file: skip it (and its attributes).
            let mut attrs = vec![line];
            while lines.peek().is_some_and(|l| l.trim_start().starts_with("#[")) {
                attrs.push(lines.next().unwrap());
            }
            if let Some(next) = lines.peek()
                && ["mod ", "pub mod ", "pub(crate) mod "].iter().any(|m| next.trim_start().starts_with(m))
            {
                let decl = lines.next().unwrap();
                if decl.trim_end().ends_with('{') {
                    let mut depth = 1i32;
                    for inner in lines.by_ref() {
                        depth += inner.matches('{').count() as i32 - inner.matches('}').count() as i32;
                        if depth <= 0 {
                            break;
                        }
                    }
                }
                continue;
            }
            out.extend(attrs.iter().map(|_| ""));
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

fn sources(krate: &str) -> Vec<Source> {
    let src = workspace().join(krate).join("src");
    // Another commit may predate a crate.
    if std::env::var_os("LAYOUT_ROOT").is_some() && !src.exists() {
        return Vec::new();
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            Source { module: module_of(&src, &file), code: production_code(&text), file }
        })
        .collect()
}

/// Every path of a `use` item, braces expanded: `use a::{b, c::{d}}` gives `a::b`, `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or_default().trim().to_owned()];
    };
    let prefix = tree[..open].trim();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
    for (i, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| if p == "self" { prefix.trim_end_matches("::").to_owned() } else { format!("{prefix}{p}") })
        .collect()
}

/// The `use` items of a file's code, braces expanded, each with whether it is `pub` (a
/// re-export).
fn uses(code: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = code.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let public = t.starts_with("pub ") || t.starts_with("pub(");
        let t =
            t.strip_prefix("pub ").or_else(|| t.split_once(") ").filter(|_| t.starts_with("pub(")).map(|(_, r)| r)).unwrap_or(t);
        let Some(item) = t.strip_prefix("use ") else { continue };
        let mut text = item.to_owned();
        for next in &lines[i + 1..] {
            if text.contains(';') {
                break;
            }
            text.push_str(next);
        }
        out.extend(expand(text.split(';').next().unwrap_or_default()).into_iter().map(|p| (public, p)));
    }
    out
}

/// The paths a file's code names: its `use` items, and the `crate::`/`super::`/`self::` paths
/// in its code.
fn paths(code: &str) -> Vec<String> {
    let mut out: Vec<String> = uses(code).into_iter().map(|(_, p)| p).collect();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            let boundary = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':');
            let len = code[at..].find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(code.len() - at);
            let path = code[at..at + len].trim_end_matches(':');
            // A bare `crate::{` is a `use` group, read whole above.
            if boundary && path.contains("::") {
                out.push(path.to_owned());
            }
            from = at + len.max(1);
        }
    }
    out
}

/// A crate's modules, and what each re-exports (`pub use`): name -> the path it re-exports.
struct Crate {
    known: BTreeSet<Vec<String>>,
    reexports: BTreeMap<Vec<String>, BTreeMap<String, String>>,
}

impl Crate {
    fn new(sources: &[Source]) -> Self {
        let known = sources.iter().map(|s| s.module.clone()).collect();
        let reexports = sources
            .iter()
            .map(|s| {
                let names = uses(&s.code)
                    .into_iter()
                    .filter(|(public, p)| *public && !p.ends_with('*'))
                    .filter_map(|(_, p)| Some((p.rsplit("::").next()?.to_owned(), p)))
                    .collect();
                (s.module.clone(), names)
            })
            .collect();
        Self { known, reexports }
    }

    /// The module a path names from `module`: as deep as known modules go, then through the
    /// re-export of the next name when that module re-exports it. `None` for outside crates.
    fn resolve(&self, module: &[String], path: &str, hops: usize) -> Option<Vec<String>> {
        let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
        let first = *segments.peek()?;
        let at: Vec<String> = match first {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().checked_sub(1)?].to_vec(),
            // `use child::X` names a child of this module (2018 paths).
            child if self.known.contains(&[module, &[child.to_owned()]].concat()) => {
                return self.walk(module.to_vec(), segments, hops);
            }
            _ => return None,
        };
        segments.next();
        self.walk(at, segments, hops)
    }

    fn walk<'a>(&self, mut at: Vec<String>, segments: impl Iterator<Item = &'a str>, hops: usize) -> Option<Vec<String>> {
        for segment in segments {
            if segment == "super" {
                at.pop();
                continue;
            }
            let mut deeper = at.clone();
            deeper.push(segment.to_owned());
            if self.known.contains(&deeper) {
                at = deeper;
                continue;
            }
            // An item of `at`: where it really lives, when `at` only re-exports it.
            // (A re-export of another crate's item imports nothing of this one.)
            if hops < 8
                && let Some(path) = self.reexports.get(&at).and_then(|r| r.get(segment))
            {
                return self.resolve(&at, path, hops + 1);
            }
            break;
        }
        Some(at)
    }
}

/// The file-to-file import graph of one crate.
fn graph(sources: &[Source]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let krate = Crate::new(sources);
    sources
        .iter()
        .map(|s| {
            let targets = paths(&s.code)
                .iter()
                .filter_map(|p| krate.resolve(&s.module, p, 0))
                .filter(|t| *t != s.module && krate.known.contains(t))
                .collect();
            (s.module.clone(), targets)
        })
        .collect()
}

/// The strongly connected groups of more than one module (Tarjan's algorithm, iterative enough
/// for a crate).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a Vec<String>) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        w.on_stack.insert(v);
        for next in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(next) {
                visit(w, next);
                let low = w.low[v].min(w.low[next]);
                w.low.insert(v, low);
            } else if w.on_stack.contains(next) {
                let low = w.low[v].min(w.index[next]);
                w.low.insert(v, low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut group = Vec::new();
            while let Some(top) = w.stack.pop() {
                w.on_stack.remove(top);
                group.push(top.clone());
                if top == v {
                    break;
                }
            }
            if group.len() > 1 {
                w.found.push(group);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

/// Functions of `code` longer than `max` lines: (line, name, length).
fn long_functions(code: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub ")
            .or_else(|| t.strip_prefix("pub(crate) "))
            .or_else(|| t.strip_prefix("pub(super) "))
            .unwrap_or(t);
        let t = t.strip_prefix("async ").or_else(|| t.strip_prefix("const ")).unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let (mut depth, mut started) = (0i32, false);
        for (j, body) in lines[i..].iter().enumerate() {
            if !started && body.trim_end().ends_with(';') && !body.contains('{') {
                break;
            }
            for ch in body.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if started && depth == 0 {
                if j + 1 > max {
                    out.push((i + 1, name.clone(), j + 1));
                }
                break;
            }
        }
    }
    out
}

#[test]
fn no_two_modules_import_each_other() {
    let mut found = Vec::new();
    for krate in CRATES {
        for group in circles(&graph(&sources(krate))) {
            let names: Vec<String> = group.iter().map(|m| format!("{krate}::{}", m.join("::"))).collect();
            found.push(names.join(" <-> "));
        }
    }
    assert!(found.is_empty(), "modules that import each other (directly or through others):\n{}", found.join("\n"));
}

#[test]
fn no_production_file_is_over_500_lines() {
    let mut found = Vec::new();
    for krate in CRATES {
        for s in sources(krate) {
            let lines = s.code.trim_end().lines().count();
            if lines > MAX_FILE_LINES {
                found.push(format!("{} ({lines} lines)", s.file.display()));
            }
        }
    }
    assert!(found.is_empty(), "production files over {MAX_FILE_LINES} lines:\n{}", found.join("\n"));
}

#[test]
fn no_function_is_over_80_lines() {
    let mut found = Vec::new();
    for krate in SHORT_FUNCTIONS {
        for s in sources(krate) {
            for (line, name, length) in long_functions(&s.code, MAX_FN_LINES) {
                found.push(format!("{}:{line} {name} ({length} lines)", s.file.display()));
            }
        }
    }
    assert!(found.is_empty(), "functions over {MAX_FN_LINES} lines:\n{}", found.join("\n"));
}

/// The checks themselves find what they are for: a circle, through a third module and through a
/// `use` group; a long function.
#[test]
fn the_checks_see_circles_and_long_functions() {
    let source = |module: &str, code: &str| Source {
        file: PathBuf::from(module),
        module: module.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect(),
        code: production_code(code),
    };
    let sources = [
        source("a", "use crate::b::Thing;\n"),
        source("b", "fn f() { super::c::g() }\n"),
        source("c", "use crate::{d, a::{self, Other}};\n"),
        source("d", "// use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n"),
        source("", "pub use b::Thing;\n"),
        source("f", "use crate::Thing;\n"),
    ];
    let graph = graph(&sources);
    let b = vec!["b".to_owned()];
    assert_eq!(graph[&vec!["f".to_owned()]], BTreeSet::from([b.clone()]), "through the root's re-export to where it lives");
    assert_eq!(graph[&Vec::new()], BTreeSet::from([b]), "a re-export imports what it names");
    let circles = circles(&graph);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(circles[0].len(), 3, "a -> b -> c -> a; d's test and comment import nothing: {circles:?}");
    let long = format!("fn long() {{\n{}}}\nfn short() {{\n}}\n", "    x();\n".repeat(80));
    assert_eq!(long_functions(&long, 80), vec![(1, "long".to_owned(), 82)]);
}
