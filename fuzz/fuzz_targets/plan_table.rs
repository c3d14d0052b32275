//! Plan tables (`FRGT`), outer and nested model frames repaired; a decoded table is sorted and its
//! budget lookup never panics.
#![no_main]
use frugal_core::format::{decode_plan_table, encode_plan_table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_plan_table(data);
    let mut fixed = data.to_vec();
    if !frugal_fuzz::repair_nested(&mut fixed) {
        return;
    }
    if let Ok((spec, table)) = decode_plan_table(&fixed) {
        assert!(table.entries.windows(2).all(|w| w[0].budget <= w[1].budget));
        for e in &table.entries {
            let _ = table.for_budget(e.budget);
        }
        let _ = table.for_budget(usize::MAX);
        decode_plan_table(&encode_plan_table(&spec, &table)).expect("a decoded table re-encodes");
    }
});
