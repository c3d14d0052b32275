//! `include/frugal.h` is what cbindgen generates from the C ABI's sources today: a header that lags
//! behind an `extern "C"` signature fails here (and so in CI). `FRUGAL_BLESS=1` rewrites it.
use std::path::Path;

#[test]
fn frugal_h_is_generated_from_the_sources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/capi.rs"))
        .with_src(dir.join("src/memory.rs"))
        .with_src(dir.join("src/error.rs"))
        .generate()
        .expect("cbindgen parses the C ABI")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8");
    let path = dir.join("include/frugal.h");
    if std::env::var_os("FRUGAL_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/frugal.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/frugal.h is stale (first difference at line {}): regenerate it with \
             `FRUGAL_BLESS=1 cargo test -p frugal-android --test header` and commit it",
            line + 1
        );
    }
    // Every function of the ABI is in it.
    for f in [
        "frugal_create",
        "frugal_add_sample",
        "frugal_train_steps",
        "frugal_predict",
        "frugal_set_budget",
        "frugal_plan_info",
        "frugal_export_weights",
        "frugal_destroy",
        "frugal_last_error",
        "frugal_budget_for_memory",
    ] {
        assert!(generated.contains(&format!(" {f}(")), "{f} missing");
    }
}
