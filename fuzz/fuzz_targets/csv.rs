//! Numeric CSV data sets: the first byte picks the label column and whether a sample shape is given.
#![no_main]
use frugal_cli::data::parse_csv;
use frugal_core::model::Dims;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    let label = (sel & 7) as usize;
    let dims = match sel >> 3 & 3 {
        0 => None,
        1 => Some(Dims::flat(2)),
        2 => Some(Dims::new(1, 2, 2)),
        _ => Some(Dims::flat(0)),
    };
    if let Ok(ds) = parse_csv(text, "fuzz.csv", label, dims) {
        if !ds.is_empty() {
            let _ = ds.sample(0);
        }
    }
});
