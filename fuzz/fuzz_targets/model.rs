//! The model binary format (`FRGM`): raw bytes (the header checks), then the same bytes with length
//! and CRC repaired (the payload parser); a decoded model re-encodes to a model that decodes equal, and
//! realising it as a graph returns a typed error or a graph, never a panic.
#![no_main]
use frugal_core::format::{decode_model, encode_model};
use frugal_core::graph::Graph;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_model(data);
    let mut fixed = data.to_vec();
    if !frugal_fuzz::repair_frame(&mut fixed) {
        return;
    }
    if let Ok(spec) = decode_model(&fixed) {
        let again = decode_model(&encode_model(&spec)).expect("a decoded model re-encodes");
        assert_eq!(
            again, spec,
            "encode ∘ decode is the identity on decoded models"
        );
        let _ = Graph::new(&spec, 1);
    }
});
