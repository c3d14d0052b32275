//! The crate's layering, checked: no module imports one above it — except the upward imports listed in
//! `KNOWN`, each with the reason it stays, every one of which must still exist (so the list, and
//! `docs/design.md` that repeats it, stay true) — and no two modules import each other. Test code is
//! left out: tests may reach anywhere.
use std::collections::BTreeSet;
use std::path::Path;
use std::string::{String, ToString};
use std::vec::Vec;

/// Bottom (0) to top. Modules of one rank may import each other, one way only.
const RANKS: &[(&str, u8)] = &[
    ("kernels", 0),
    ("pool", 0),
    ("budget", 0),
    ("rng", 0),
    ("sort", 0),
    ("spill", 0),
    ("ops", 1),
    ("model", 2),
    ("optim", 2),
    ("graph", 3),
    ("quant", 4),
    ("plan", 5),
    ("backend", 6),
    ("format", 7),
    ("policy", 7),
    ("exec", 8),
];

/// Upward imports that stay, with why: (importer, imported).
const KNOWN: &[(&str, &str)] = &[
    // `Placement` is named in every instruction of a plan; it is defined with the backends that serve
    // each placement.
    ("plan", "backend"),
];

fn rank(m: &str) -> Option<u8> {
    RANKS.iter().find(|(n, _)| *n == m).map(|r| r.1)
}

/// The top-level modules `src` names through `crate::` outside comments (`use crate::{a, b::c}` too).
fn imports(src: &str) -> BTreeSet<String> {
    let code: String = src
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: after `{` and after each comma at depth 1.
            let mut depth = 1;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            out.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Where an inline `#[cfg(test)] mod … {` begins (test code to the end of the file), or the end.
fn test_tail(text: &str) -> usize {
    text.match_indices("#[cfg(test)]")
        .find(|(i, a)| {
            let after = text[i + a.len()..].trim_start();
            after.starts_with("mod ") && after.lines().next().is_some_and(|l| l.contains('{'))
        })
        .map_or(text.len(), |(i, _)| i)
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

#[test]
fn no_module_imports_one_above_it_but_the_known_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut upward: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut level: BTreeSet<(String, String)> = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let name = rel.to_string_lossy();
        if name.ends_with("tests.rs") || name == "lib.rs" {
            continue;
        }
        let module = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let Some(mine) = rank(&module) else {
            panic!("{name}: module `{module}` has no rank in RANKS");
        };
        let text = std::fs::read_to_string(f).unwrap();
        let code = &text[..test_tail(&text)];
        for m in imports(code) {
            if m == module {
                continue;
            }
            match rank(&m) {
                Some(r) if r > mine => {
                    upward.insert((module.clone(), m, name.to_string()));
                }
                Some(r) if r == mine => {
                    level.insert((module.clone(), m));
                }
                Some(_) => {}
                None => {} // `crate::Budget` and other re-exports at the root
            }
        }
    }
    let found: BTreeSet<(&str, &str)> = upward
        .iter()
        .map(|(a, b, _)| (a.as_str(), b.as_str()))
        .collect();
    let unknown: Vec<&(String, String, String)> = upward
        .iter()
        .filter(|(a, b, _)| !KNOWN.contains(&(a.as_str(), b.as_str())))
        .collect();
    assert!(
        unknown.is_empty(),
        "upward imports (importer, imported, file): {unknown:?}"
    );
    // Modules of one rank may import each other, but not both ways (no cycles).
    let cycles: Vec<&(String, String)> = level
        .iter()
        .filter(|(a, b)| a < b && level.contains(&(b.clone(), a.clone())))
        .collect();
    assert!(
        cycles.is_empty(),
        "modules that import each other: {cycles:?}"
    );
    for k in KNOWN {
        assert!(
            found.contains(k),
            "{k:?} is listed but no longer imported: remove it from KNOWN and docs/design.md"
        );
    }
}

#[test]
fn imports_are_read_from_use_groups_and_paths() {
    let m = imports(
        "use crate::{graph::Graph, plan::{Plan, Eo}};\n// crate::exec in a comment\nlet x = crate::ops::relu;",
    );
    let v: Vec<&str> = m.iter().map(|s| s.as_str()).collect();
    assert_eq!(v, ["graph", "ops", "plan"]);
}
