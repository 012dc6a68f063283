//! The house as it is drawn: no import cycle between the files of a crate, the dependency edges
//! docs/architecture.md lists are `cargo metadata`'s, and command-line parsing lives in the
//! binary crate only. Plain text analysis of the sources, no MPI or build needed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One crate's files: module path (`engine::compute`) → file, and each file's text (test
/// modules at the end of a file cut off).
struct Crate {
    name: String,
    modules: BTreeMap<Vec<String>, PathBuf>,
    text: HashMap<PathBuf, String>,
}

impl Crate {
    fn read(name: &str, src: &Path) -> Crate {
        let mut modules = BTreeMap::new();
        let mut text = HashMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let rel: Vec<String> = path
                    .strip_prefix(src)
                    .unwrap()
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let mut module = rel.clone();
                if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    module.pop();
                }
                // Test-only files are not part of the house.
                if module.iter().any(|m| m == "tests" || m == "testing") {
                    continue;
                }
                let source = std::fs::read_to_string(&path).unwrap();
                text.insert(path.clone(), without_tests(&source));
                modules.insert(module, path);
            }
        }
        Crate { name: name.into(), modules, text }
    }

    fn file(&self, module: &[String]) -> Option<&PathBuf> {
        self.modules.get(module)
    }

    /// The file that defines `name` as seen from module `module` (following `pub use`), or the
    /// module's own file when `name` is a module.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<PathBuf> {
        if depth > 8 {
            return None;
        }
        let mut at: Vec<String> = module.to_vec();
        let mut rest = path;
        while let Some((first, tail)) = rest.split_first() {
            let mut next = at.clone();
            next.push(first.clone());
            if self.modules.contains_key(&next) {
                at = next;
                rest = tail;
            } else {
                break;
            }
        }
        let file = self.file(&at)?;
        let Some(item) = rest.first() else { return Some(file.clone()) };
        let text = &self.text[file];
        if defines(text, item) {
            return Some(file.clone());
        }
        for (target, alias) in reexports(text) {
            if alias == *item {
                let full = self.absolute(&at, &target)?;
                return self.resolve(&[], &full, depth + 1);
            }
        }
        None
    }

    /// `path` as seen from module `here`, from the crate root: `crate::`, `self::`, `super::`,
    /// or a child module's name; `None` for another crate's path.
    fn absolute(&self, here: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut child = here.to_vec();
        child.push(first.clone());
        if self.modules.contains_key(&child) {
            return Some([here, path].concat());
        }
        absolute(here, path)
    }

    /// The files each file imports from (by `use` and by qualified `crate::`/`super::` paths),
    /// with the names that tie them.
    fn edges(&self) -> BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> {
        let mut edges: BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &self.modules {
            for path in imported_paths(&self.text[file]) {
                let Some(full) = self.absolute(module, &path) else { continue };
                if let Some(target) = self.resolve(&[], &full, 0) {
                    if &target != file {
                        let name = full.last().cloned().unwrap_or_default();
                        edges.entry((file.clone(), target)).or_default().insert(name);
                    }
                }
            }
        }
        edges
    }
}

/// The text before a trailing `#[cfg(test)] mod tests` (the house's convention).
fn without_tests(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod tests")) {
            return lines[..i].join("\n");
        }
    }
    source.to_string()
}

/// Whether `text` defines an item `name` at its top level.
fn defines(text: &str, name: &str) -> bool {
    const KINDS: [&str; 10] =
        ["fn", "struct", "enum", "trait", "type", "const", "static", "mod", "union", "macro_rules!"];
    text.lines().filter(|l| !l.starts_with(' ') && !l.starts_with('}')).any(|line| {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == ':' || c == '{' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        words.windows(2).any(|w| KINDS.contains(&w[0]) && w[1] == name)
    })
}

/// Every `pub use` of a file: (the path it names, the name it is re-exported as).
fn reexports(text: &str) -> Vec<(Vec<String>, String)> {
    use_statements(text)
        .into_iter()
        .filter(|(public, _)| *public)
        .flat_map(|(_, tree)| expand(&tree))
        .filter_map(|p| {
            let (path, alias) = split_alias(&p);
            let last = alias.or_else(|| path.last().cloned())?;
            (last != "*").then_some((path, last))
        })
        .collect()
}

/// The paths a file imports: its non-public `use` trees and qualified `crate::`/`super::`/`self::`
/// paths in its code.
fn imported_paths(text: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = use_statements(text)
        .into_iter()
        .filter(|(public, _)| !public)
        .flat_map(|(_, tree)| expand(&tree))
        .map(|p| split_alias(&p).0)
        .filter(|p| p.last().is_some_and(|l| l != "*"))
        .collect();
    let is_use = |l: &str| {
        let l = l.trim_start();
        l.starts_with("use ")
            || l.starts_with("pub use ")
            || l.starts_with("pub(crate) use ")
            || l.starts_with("pub(super) use ")
    };
    for line in text.lines().filter(|l| !is_use(l)) {
        let code = line.split("//").next().unwrap_or("");
        for start in ["crate::", "super::", "self::"] {
            let mut from = 0;
            while let Some(i) = code[from..].find(start) {
                let at = from + i;
                from = at + start.len();
                if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let path: Vec<String> = code[at..]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap_or("")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                if path.len() > 1 {
                    out.push(path);
                }
            }
        }
    }
    out
}

/// Every `use` statement of a file, joined over its lines: (whether it is public, the tree).
fn use_statements(text: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut current: Option<(bool, String)> = None;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if let Some((public, buf)) = current.as_mut() {
            buf.push_str(code);
            if code.ends_with(';') {
                out.push((*public, buf.trim_end_matches(';').to_string()));
                current = None;
            }
            continue;
        }
        // Any `pub(…) use` re-exports: it names where an item is found, it is not a use of it.
        let (public, rest) = if let Some(r) = code.strip_prefix("pub use ") {
            (true, r)
        } else if let Some(r) = code.strip_prefix("pub(crate) use ").or_else(|| code.strip_prefix("pub(super) use ")) {
            (true, r)
        } else if let Some(r) = code.strip_prefix("use ") {
            (false, r)
        } else {
            continue;
        };
        if rest.ends_with(';') {
            out.push((public, rest.trim_end_matches(';').to_string()));
        } else {
            current = Some((public, rest.to_string()));
        }
    }
    out
}

/// `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e as f`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace() || *c == ' ').collect();
    let tree = tree.trim();
    let Some(open) = tree.find('{') else { return vec![tree.to_string()] };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
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
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand(p).into_iter().map(move |e| {
                if e == "self" {
                    prefix.trim_end_matches("::").to_string()
                } else {
                    format!("{prefix}{e}")
                }
            })
        })
        .collect()
}

/// `a::b as c` → (`[a, b]`, `Some(c)`).
fn split_alias(path: &str) -> (Vec<String>, Option<String>) {
    let (path, alias) = match path.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_string())),
        None => (path, None),
    };
    (path.trim().split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(), alias)
}

/// `path` as seen from module `here`, from the crate root; `None` for another crate's path.
fn absolute(here: &[String], path: &[String]) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some([here, rest].concat()),
        "super" => {
            let mut base = here.to_vec();
            base.pop()?;
            let mut rest = rest;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            Some([base.as_slice(), rest].concat())
        }
        _ => None,
    }
}

/// The strongly connected groups of more than one file among `edges` (Tarjan).
fn cycles(edges: &BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>) -> Vec<Vec<PathBuf>> {
    let mut graph: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    struct State<'a> {
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(v: &'a PathBuf, g: &BTreeMap<&'a PathBuf, Vec<&'a PathBuf>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in &g[v] {
            if !s.index.contains_key(w) {
                visit(w, g, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s =
        State { index: HashMap::new(), low: HashMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, &graph, &mut s);
        }
    }
    s.out
}

/// Each cycle with what ties it, for a failure message.
fn describe(krate: &Crate, found: &[Vec<PathBuf>], edges: &BTreeMap<(PathBuf, PathBuf), BTreeSet<String>>) -> String {
    let rel = |p: &PathBuf| p.strip_prefix(ROOT).unwrap_or(p).display().to_string();
    let mut text = String::new();
    for group in found {
        text += &format!("{}: {}\n", krate.name, group.iter().map(rel).collect::<Vec<_>>().join(", "));
        for ((a, b), names) in edges {
            if group.contains(a) && group.contains(b) {
                text +=
                    &format!("  {} -> {}: {}\n", rel(a), rel(b), names.iter().cloned().collect::<Vec<_>>().join(", "));
            }
        }
    }
    text
}

#[test]
fn no_file_of_a_crate_imports_a_file_that_imports_it_back() {
    let mut report = String::new();
    for name in ["core", "data", "kernels", "topology", "exec", "runtime", "bench"] {
        let krate = Crate::read(name, &Path::new(ROOT).join("crates").join(name).join("src"));
        let edges = krate.edges();
        let found = cycles(&edges);
        report += &describe(&krate, &found, &edges);
    }
    let binary = Crate::read("nereus", &Path::new(ROOT).join("src"));
    let edges = binary.edges();
    report += &describe(&binary, &cycles(&edges), &edges);
    assert!(report.is_empty(), "import cycles between files:\n{report}");
}

#[test]
fn the_checker_finds_a_cycle_it_is_shown() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod b;\nmod c;\npub use b::Thing;\n").unwrap();
    std::fs::write(src.join("a/b.rs"), "use super::c::Other;\npub struct Thing;\n").unwrap();
    std::fs::write(src.join("a/c.rs"), "pub struct Other;\nfn f() { let _ = crate::a::Thing; }\n").unwrap();
    let krate = Crate::read("toy", src);
    let found = cycles(&krate.edges());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0], vec![src.join("a/b.rs"), src.join("a/c.rs")]);
}

/// The workspace's crates and their workspace dependencies, from `cargo metadata`: each crate's
/// normal dependencies among the workspace's own, an optional one marked with a trailing `?`.
fn workspace_edges() -> BTreeMap<String, BTreeSet<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(ROOT)
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata writes JSON");
    let packages = meta["packages"].as_array().expect("a package list");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut edges = BTreeMap::new();
    for p in packages {
        let deps = p["dependencies"].as_array().into_iter().flatten();
        let mine: BTreeSet<String> = deps
            .filter(|d| d["kind"].is_null() && d["name"].as_str().is_some_and(|n| names.contains(n)))
            .map(|d| format!("{}{}", d["name"].as_str().unwrap_or(""), if d["optional"] == true { "?" } else { "" }))
            .collect();
        edges.insert(p["name"].as_str().unwrap_or("").to_string(), mine);
    }
    edges
}

/// The `crate dependencies` block of docs/architecture.md.
fn documented_edges() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let block = doc.split("```text\ncrate dependencies\n").nth(1).expect("docs/architecture.md has the block");
    let block = block.split("```").next().unwrap_or("");
    block
        .lines()
        .filter_map(|l| l.split_once("->"))
        .map(|(from, to)| {
            let to = to.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
            (from.trim().to_string(), to)
        })
        .collect()
}

#[test]
fn the_crate_graph_in_the_docs_is_cargos() {
    assert_eq!(
        documented_edges(),
        workspace_edges(),
        "docs/architecture.md's crate dependencies against cargo metadata"
    );
}

#[test]
fn no_library_crate_depends_on_the_command_line_parser() {
    let crates: Vec<String> = workspace_edges().into_keys().filter(|name| name != "nereus").collect();
    assert!(crates.len() >= 7, "{crates:?}");
    for name in crates {
        // `cargo tree` resolves for this machine only (`cargo metadata` would fetch every
        // platform's crates).
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "-p", &name])
            .current_dir(ROOT)
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo tree -p {name}: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8_lossy(&out.stdout);
        let clap: Vec<&str> = tree.lines().filter(|l| l.starts_with("clap")).collect();
        assert!(clap.is_empty(), "{name} depends on {clap:?}: command-line parsing belongs in the binary");
    }
}
