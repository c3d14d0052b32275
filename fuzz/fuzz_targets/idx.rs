//! IDX image and label files (MNIST's format) and the data set built from them. The first byte picks
//! which reader and the pixel scale; the rest is the file.
#![no_main]
use frugal_cli::data::{dataset_from_idx, read_idx_images, read_idx_labels};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let max = [255.0, 16.0, 1.0, 0.5][(sel & 3) as usize];
    if sel & 4 == 0 {
        let _ = read_idx_labels(rest, "labels.idx");
        let _ = read_idx_images(rest, "images.idx", max);
        return;
    }
    // Images and labels in one input: a u16 length of the image part, then the label file.
    if rest.len() < 2 {
        return;
    }
    let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
    let rest = &rest[2..];
    let (imgs, labels) = rest.split_at(n.min(rest.len()));
    if let (Ok(i), Ok(l)) = (
        read_idx_images(imgs, "images.idx", max),
        read_idx_labels(labels, "labels.idx"),
    ) {
        if let Ok(ds) = dataset_from_idx(i, l, "images.idx", "labels.idx") {
            if !ds.is_empty() {
                let _ = ds.sample(ds.len() - 1);
            }
        }
    }
});
