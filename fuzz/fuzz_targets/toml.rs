//! The TOML model description: text in, a model (then realised as a graph at batch 1) or an error with
//! a line and column, never a panic.
#![no_main]
use frugal_cli::spec_toml::parse_model;
use frugal_core::graph::Graph;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(mf) = parse_model(text) {
        let bytes = frugal_core::format::encode_model(&mf.spec);
        let _ = frugal_core::format::decode_model(&bytes);
        let _ = Graph::new(&mf.spec, 1);
    }
});
