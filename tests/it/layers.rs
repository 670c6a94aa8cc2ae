//! The layer rule of `src/lib.rs`, checked: no module of the crate names a module of a layer
//! above its own (`crate::<module>` in code, `use` lines included; comments are not read).

use std::path::Path;

/// The layers, lowest first; a module may name its own layer and those below it. Must match
/// the rule written at the top of `src/lib.rs`.
const LAYERS: &[&[&str]] = &[
    &["proto"],
    &["domain"], // crates/opjournal-domain, re-exported
    &["telemetry"],
    &["store"],
    &["journal"],
    &["reconcile"],
    &["api"],
    &["config"],
    &["app"],
    &["cli", "ops", "children"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules `line` names as `crate::<module>`.
fn named_modules(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `opjournal_crate::`, not this crate
        }
        let module: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        found.push(module);
    }
    found
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_str().unwrap().trim_end_matches(".rs");
        if module == "bin" || module == "lib" {
            continue; // binaries stand above every layer; lib.rs only declares modules
        }
        let own = layer(module).unwrap_or_else(|| {
            panic!("src/{module} is in no layer: add it to LAYERS and to src/lib.rs")
        });
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for named in named_modules(code) {
                checked += 1;
                let Some(theirs) = layer(&named) else {
                    continue; // a crate-level item (e.g. `crate::client`) re-exported by lib.rs
                };
                if theirs > own {
                    broken.push(format!(
                        "src/{}:{}: {module} names {named}",
                        relative.display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} crate paths read: is src/ there?"
    );
    assert!(
        broken.is_empty(),
        "imports from a higher layer:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_rule_is_written_in_lib_rs() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let rule = LAYERS
        .iter()
        .map(|layer| layer.join(", "))
        .collect::<Vec<_>>()
        .join(" < ");
    assert!(
        lib.contains(&rule),
        "src/lib.rs must state the rule: {rule}"
    );
}

/// Crates the domain must not reach, directly or through another: transport, storage and the
/// client SDK. The domain is `crates/opjournal-domain`; the server re-exports it as `domain`.
const NOT_IN_THE_DOMAIN: &[&str] = &[
    "axum",
    "h2",
    "hyper",
    "opjournal",
    "opjournal-client",
    "opjournal-proto",
    "prost",
    "reqwest",
    "sqlx",
    "tokio",
    "tonic",
    "tower",
];

/// The crates `package` depends on in normal builds, transitively (`cargo tree -e normal`).
fn dependencies_of(package: &str) -> Vec<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut crates: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

#[test]
fn the_domain_uses_no_transport_storage_or_client_crate() {
    let crates = dependencies_of("opjournal-domain");
    assert!(
        crates.contains(&"serde".to_owned()),
        "no tree read: {crates:?}"
    );
    let reached: Vec<_> = crates
        .iter()
        .filter(|name| NOT_IN_THE_DOMAIN.contains(&name.as_str()))
        .collect();
    assert!(
        reached.is_empty(),
        "crates/opjournal-domain reaches {reached:?}: the domain knows nothing of gRPC, HTTP, \
         SQL or the client SDK"
    );
    let workspace: Vec<_> = crates
        .iter()
        .filter(|name| name.starts_with("opjournal") && *name != "opjournal-domain")
        .collect();
    assert_eq!(
        workspace,
        ["opjournal-reasons"],
        "the domain may use only the protocol's reasons of the workspace's crates"
    );
}

#[test]
fn the_reasons_crate_has_no_dependencies() {
    assert_eq!(dependencies_of("opjournal-reasons"), ["opjournal-reasons"]);
}

#[test]
fn docs_errors_md_lists_every_reason() {
    let catalog =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/errors.md"))
            .unwrap();
    let missing: Vec<_> = opjournal::domain::error::ErrorReason::all()
        .map(|(name, _)| name)
        .filter(|name| !catalog.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/errors.md does not list {missing:?}: give each its code, meaning and what a caller \
         should do"
    );
}
