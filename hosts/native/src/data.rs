//! Datasets for classification: the bundled UCI digits, MNIST-style IDX files, numeric CSV.
//!
//! Every reader validates what it reads and never panics on malformed input; errors name the file and
//! the place (byte offset, line, column) and say what is wrong.
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use frugal_core::model::Dims;
use frugal_core::rng::{hash2, Rng};

/// Why a dataset could not be read.
#[derive(Debug)]
pub enum DataError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An IDX file's header or size is wrong.
    Idx {
        /// The file name.
        file: String,
        /// What is wrong (names the byte offset or the header field).
        reason: String,
    },
    /// A CSV cell or row is wrong.
    Csv {
        /// The file name.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column, when one cell is at fault.
        column: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// The images and labels do not fit together, or a label is out of range.
    Mismatch {
        /// The file (or data set) name.
        file: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            DataError::Idx { file, reason } | DataError::Mismatch { file, reason } => {
                write!(f, "{file}: {reason}")
            }
            DataError::Csv {
                file,
                line,
                column: Some(c),
                reason,
            } => write!(f, "{file}: line {line}, column {c}: {reason}"),
            DataError::Csv {
                file,
                line,
                column: None,
                reason,
            } => write!(f, "{file}: line {line}: {reason}"),
        }
    }
}

impl std::error::Error for DataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DataError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A labelled classification data set held in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Per-sample shape.
    pub dims: Dims,
    /// Number of classes; every label is `< classes`.
    pub classes: u32,
    /// Samples, row-major: `len() × dims.numel()` values.
    pub x: Vec<f32>,
    /// `tokens` class indices per sample.
    pub y: Vec<u32>,
    /// Labels per sample: 1, or the sequence length of a text data set (a next-token label per
    /// token, [`crate::text`]).
    pub tokens: usize,
}

impl Dataset {
    /// Checks that `x` holds `y.len()` samples of `dims` and that every label is `< classes`;
    /// `name` is used in errors.
    pub fn new(
        dims: Dims,
        classes: u32,
        x: Vec<f32>,
        y: Vec<u32>,
        name: &str,
    ) -> Result<Self, DataError> {
        let mismatch = |reason: String| DataError::Mismatch {
            file: name.to_string(),
            reason,
        };
        let per = dims.c as u128 * dims.h as u128 * dims.w as u128;
        if per == 0 || per > u32::MAX as u128 {
            return Err(mismatch(format!(
                "sample shape {dims} is empty or too large"
            )));
        }
        let numel = per as usize;
        if x.len() != y.len().saturating_mul(numel) {
            return Err(mismatch(format!(
                "{} values do not make {} samples of {dims}",
                x.len(),
                y.len()
            )));
        }
        if let Some((i, &l)) = y.iter().enumerate().find(|(_, &l)| l >= classes) {
            return Err(mismatch(format!(
                "label {l} of sample {i} is not below the class count {classes}"
            )));
        }
        Ok(Self {
            dims,
            classes,
            x,
            y,
            tokens: 1,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len() / self.tokens.max(1)
    }

    /// The labels of samples `i..i + n`.
    pub fn labels(&self, i: usize, n: usize) -> &[u32] {
        &self.y[i * self.tokens..(i + n) * self.tokens]
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Sample `i`: its values and its label. Panics if `i >= len()`.
    pub fn sample(&self, i: usize) -> (&[f32], u32) {
        let n = self.dims.numel();
        (&self.x[i * n..(i + 1) * n], self.y[i])
    }

    /// Copies the samples at `indices` into the front of `xbuf` (`indices.len() × numel` values) and
    /// their labels into the front of `ybuf`. Panics if a buffer is too short or an index is out of
    /// range (both are caller bugs, not data errors).
    pub fn batch(&self, indices: &[usize], xbuf: &mut [f32], ybuf: &mut [u32]) {
        let n = self.dims.numel();
        let t = self.tokens;
        assert!(
            xbuf.len() >= indices.len() * n && ybuf.len() >= indices.len() * t,
            "batch buffers too small for {} samples of {}",
            indices.len(),
            self.dims
        );
        for (k, &i) in indices.iter().enumerate() {
            xbuf[k * n..(k + 1) * n].copy_from_slice(&self.x[i * n..(i + 1) * n]);
            ybuf[k * t..(k + 1) * t].copy_from_slice(self.labels(i, 1));
        }
    }

    /// A permutation of `0..len()` for `epoch`, determined by `(seed, epoch)` alone: the same on every
    /// run and every platform, different from epoch to epoch (Fisher–Yates over SplitMix64).
    pub fn shuffle_indices(&self, seed: u64, epoch: u64) -> Vec<usize> {
        shuffled(self.len(), seed, epoch)
    }

    /// The class count as the largest label + 1 (at least 1).
    fn classes_of(y: &[u32]) -> u32 {
        y.iter().max().map_or(1, |&m| m.saturating_add(1))
    }
}

/// Images decoded from an IDX file.
#[derive(Clone, Debug, PartialEq)]
pub struct IdxImages {
    /// Number of images.
    pub n: usize,
    /// Per-image shape: `[n, h, w]` files give `1×h×w`, `[n, c, h, w]` give `c×h×w`, `[n, f]` give `f×1×1`.
    pub dims: Dims,
    /// Pixels divided by the caller's maximum, so in `[0, 1]`; `n × dims.numel()` values.
    pub pixels: Vec<f32>,
}

fn idx_err(file: &str, reason: String) -> DataError {
    DataError::Idx {
        file: file.to_string(),
        reason,
    }
}

/// Parses an IDX header of u8 data: returns the dimensions and the data bytes.
fn idx_header<'a>(
    bytes: &'a [u8],
    file: &str,
    ranks: std::ops::RangeInclusive<u8>,
    expect_magic: u32,
) -> Result<(Vec<u32>, &'a [u8]), DataError> {
    if bytes.len() < 4 {
        return Err(idx_err(
            file,
            format!(
                "{} bytes is too short for the 4-byte IDX magic",
                bytes.len()
            ),
        ));
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let (zero, ty, rank) = (magic >> 16, bytes[2], bytes[3]);
    if zero != 0 || ty != 0x08 || !ranks.contains(&rank) {
        return Err(idx_err(
            file,
            format!(
                "magic 0x{magic:08x} at offset 0 is not an IDX file of u8 {} (expected 0x{expect_magic:08x})",
                if ranks.end() == &1 { "labels" } else { "images" }
            ),
        ));
    }
    let header_len = 4 + 4 * rank as usize;
    if bytes.len() < header_len {
        return Err(idx_err(
            file,
            format!(
                "header needs {header_len} bytes for {rank} dimensions but the file has {}",
                bytes.len()
            ),
        ));
    }
    let dims: Vec<u32> = bytes[4..header_len]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((dims, &bytes[header_len..]))
}

fn check_scale(scale: f32) {
    assert!(
        scale.is_finite() && scale > 0.0,
        "pixel scale must be positive"
    );
}

/// Decodes an IDX image file (magic `0x00000803`; also rank 2 and 4) of u8 pixels; each pixel is
/// divided by `max` (255 for MNIST, 16 for the bundled digits). A pixel above `max` is an error.
/// `name` is used in errors. Panics if `max` is not a positive finite number.
pub fn read_idx_images(bytes: &[u8], name: &str, max: f32) -> Result<IdxImages, DataError> {
    check_scale(max);
    let (d, data) = idx_header(bytes, name, 2..=4, 0x0000_0803)?;
    let n = d[0] as usize;
    let dims = match d[1..] {
        [f] => Dims::flat(f),
        [h, w] => Dims::new(1, h, w),
        [c, h, w] => Dims::new(c, h, w),
        _ => unreachable!("rank checked by idx_header"),
    };
    let shape = d[1..]
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join("×");
    let per = dims.c as u128 * dims.h as u128 * dims.w as u128;
    if per == 0 || per > u32::MAX as u128 {
        return Err(idx_err(
            name,
            format!("image shape {shape} is empty or too large"),
        ));
    }
    if n as u128 * per != data.len() as u128 {
        return Err(idx_err(
            name,
            format!(
                "header says {n} images of {shape} but file holds {} bytes of data",
                data.len()
            ),
        ));
    }
    if let Some(at) = data.iter().position(|&p| p as f32 > max) {
        return Err(idx_err(
            name,
            format!(
                "pixel value {} at offset {} exceeds the maximum {max}",
                data[at],
                bytes.len() - data.len() + at
            ),
        ));
    }
    let inv = 1.0 / max;
    Ok(IdxImages {
        n,
        dims,
        pixels: data.iter().map(|&p| p as f32 * inv).collect(),
    })
}

/// Decodes an IDX label file (magic `0x00000801`, u8 labels). `name` is used in errors.
pub fn read_idx_labels(bytes: &[u8], name: &str) -> Result<Vec<u32>, DataError> {
    let (d, data) = idx_header(bytes, name, 1..=1, 0x0000_0801)?;
    if d[0] as u64 != data.len() as u64 {
        return Err(idx_err(
            name,
            format!(
                "header says {} labels but file holds {} bytes of data",
                d[0],
                data.len()
            ),
        ));
    }
    Ok(data.iter().map(|&l| l as u32).collect())
}

/// Builds a data set from decoded IDX images and labels; the class count is the largest label + 1.
pub fn dataset_from_idx(
    images: IdxImages,
    labels: Vec<u32>,
    images_name: &str,
    labels_name: &str,
) -> Result<Dataset, DataError> {
    if images.n != labels.len() {
        return Err(DataError::Mismatch {
            file: labels_name.to_string(),
            reason: format!(
                "{} labels but {images_name} holds {} images",
                labels.len(),
                images.n
            ),
        });
    }
    let classes = Dataset::classes_of(&labels);
    Dataset::new(images.dims, classes, images.pixels, labels, labels_name)
}

fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads an IDX image file and its IDX label file (e.g. MNIST with `max = 255.0`).
pub fn load_idx(images_path: &Path, labels_path: &Path, max: f32) -> Result<Dataset, DataError> {
    let (iname, lname) = (
        images_path.display().to_string(),
        labels_path.display().to_string(),
    );
    let images = read_idx_images(&read_file(images_path)?, &iname, max)?;
    let labels = read_idx_labels(&read_file(labels_path)?, &lname)?;
    dataset_from_idx(images, labels, &iname, &lname)
}

/// A permutation of `0..len` for `epoch`, determined by `(seed, epoch)` alone (Fisher–Yates over
/// SplitMix64): [`Dataset::shuffle_indices`]'s order, for hosts that keep samples elsewhere (Python).
pub fn shuffled(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..len).collect();
    let mut rng = Rng::new(hash2(seed, epoch));
    for i in (1..idx.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    idx
}

/// Training and test sets of the bundled UCI handwritten digits (1437 + 360 samples of 1×8×8,
/// pixels scaled from 0..16 to [0, 1], 10 classes). See `data/digits/README.md` for the source,
/// licence (CC BY 4.0) and split.
pub fn digits() -> (Dataset, Dataset) {
    macro_rules! bundled {
        ($f:literal) => {
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../data/digits/",
                $f
            ))
        };
    }
    let load = |images: &[u8], labels: &[u8], iname: &str, lname: &str| {
        let images = read_idx_images(images, iname, 16.0).expect("bundled digits are valid");
        let labels = read_idx_labels(labels, lname).expect("bundled digits are valid");
        let mut d =
            dataset_from_idx(images, labels, iname, lname).expect("bundled digits are valid");
        d.classes = 10;
        d
    };
    (
        load(
            bundled!("digits-train-images.idx"),
            bundled!("digits-train-labels.idx"),
            "digits-train-images.idx",
            "digits-train-labels.idx",
        ),
        load(
            bundled!("digits-test-images.idx"),
            bundled!("digits-test-labels.idx"),
            "digits-test-images.idx",
            "digits-test-labels.idx",
        ),
    )
}

/// Loads a numeric CSV file; see [`parse_csv`].
pub fn load_csv(
    path: &Path,
    label_column: usize,
    dims: Option<Dims>,
) -> Result<Dataset, DataError> {
    let bytes = read_file(path)?;
    parse_csv(&bytes, &path.display().to_string(), label_column, dims)
}

/// Parses a numeric CSV text: one sample per line, comma-separated, the class index in the
/// 0-based column `label_column` and the features in the other columns, in order. A first line that
/// is not all numbers is taken as a header and skipped; blank lines are skipped. Features must be
/// finite numbers; labels non-negative integers (`3` or `3.0`). With `dims`, each row must have
/// exactly `dims.numel()` features; without, the shape is `F×1×1`. Classes = largest label + 1.
/// Errors name the 1-based line and column.
pub fn parse_csv(
    bytes: &[u8],
    name: &str,
    label_column: usize,
    dims: Option<Dims>,
) -> Result<Dataset, DataError> {
    let err = |line: usize, column: Option<usize>, reason: String| DataError::Csv {
        file: name.to_string(),
        line,
        column,
        reason,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        err(
            line,
            None,
            format!("not UTF-8 text (byte offset {})", e.valid_up_to()),
        )
    })?;
    let mut x = Vec::new();
    let mut y = Vec::new();
    let mut columns: Option<usize> = None;
    let mut first = true;
    for (li, raw) in text.lines().enumerate() {
        let line = li + 1;
        let row = raw.trim();
        if row.is_empty() {
            continue;
        }
        let cells: Vec<&str> = row.split(',').map(str::trim).collect();
        if std::mem::take(&mut first) && cells.iter().any(|c| c.parse::<f64>().is_err()) {
            continue; // header
        }
        match columns {
            None => {
                if label_column >= cells.len() {
                    return Err(err(
                        line,
                        None,
                        format!(
                            "label_column {label_column} (0-based) is outside the row's {} columns",
                            cells.len()
                        ),
                    ));
                }
                let features = cells.len() - 1;
                if let Some(d) = dims {
                    if d.c as u128 * d.h as u128 * d.w as u128 != features as u128 {
                        return Err(err(
                            line,
                            None,
                            format!(
                                "{features} feature columns but the model input {d} needs {}",
                                d.c as u128 * d.h as u128 * d.w as u128
                            ),
                        ));
                    }
                }
                if features == 0 {
                    return Err(err(line, None, "no feature columns".into()));
                }
                columns = Some(cells.len());
            }
            Some(c) if c != cells.len() => {
                return Err(err(
                    line,
                    None,
                    format!("{} columns, but the first data row has {c}", cells.len()),
                ))
            }
            Some(_) => {}
        }
        for (ci, cell) in cells.iter().enumerate() {
            let column = Some(ci + 1);
            let v: f64 = cell
                .parse()
                .map_err(|_| err(line, column, format!("\"{cell}\" is not a number")))?;
            if !v.is_finite() {
                return Err(err(
                    line,
                    column,
                    format!("\"{cell}\" is not a finite number"),
                ));
            }
            if ci == label_column {
                if v < 0.0 || v.fract() != 0.0 || v > u32::MAX as f64 - 1.0 {
                    return Err(err(
                        line,
                        column,
                        format!("label \"{cell}\" is not a non-negative integer"),
                    ));
                }
                y.push(v as u32);
            } else {
                let f = v as f32;
                if !f.is_finite() {
                    return Err(err(line, column, format!("\"{cell}\" overflows f32")));
                }
                x.push(f);
            }
        }
    }
    let Some(c) = columns else {
        return Err(err(1, None, "no data rows".into()));
    };
    let dims = dims.unwrap_or(Dims::flat((c - 1) as u32));
    let classes = Dataset::classes_of(&y);
    Dataset::new(dims, classes, x, y, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mutate, scratch_dir};
    use proptest::prelude::*;

    fn idx(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut b = magic.to_be_bytes().to_vec();
        for d in dims {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn idx_images_and_labels() {
        let img = idx(0x803, &[2, 2, 3], &[0, 16, 8, 4, 2, 1, 16, 16, 0, 0, 0, 8]);
        let im = read_idx_images(&img, "i.idx", 16.0).unwrap();
        assert_eq!(im.n, 2);
        assert_eq!(im.dims, Dims::new(1, 2, 3));
        assert_eq!(&im.pixels[..3], &[0.0, 1.0, 0.5]);
        let lab = read_idx_labels(&idx(0x801, &[2], &[3, 7]), "l.idx").unwrap();
        assert_eq!(lab, vec![3, 7]);
        let ds = dataset_from_idx(im, lab, "i.idx", "l.idx").unwrap();
        assert_eq!((ds.len(), ds.classes), (2, 8));
        assert_eq!(ds.sample(1), (&[1.0, 1.0, 0.0, 0.0, 0.0, 0.5][..], 7));
        // Rank 4 (N, C, H, W) and rank 2 (N, F).
        let im4 = read_idx_images(&idx(0x804, &[1, 2, 1, 1], &[255, 0]), "c", 255.0).unwrap();
        assert_eq!((im4.dims, im4.pixels), (Dims::new(2, 1, 1), vec![1.0, 0.0]));
        let im2 = read_idx_images(&idx(0x802, &[1, 3], &[0, 0, 0]), "f", 255.0).unwrap();
        assert_eq!(im2.dims, Dims::flat(3));
    }

    #[test]
    fn idx_errors_name_file_and_reason() {
        let e = read_idx_images(
            &idx(0x803, &[1437, 8, 8], &[0; 1000]),
            "digits-train-images.idx",
            16.0,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "digits-train-images.idx: header says 1437 images of 8×8 but file holds 1000 bytes of data"
        );
        let e = read_idx_images(&idx(0x801, &[2], &[0, 0]), "x.idx", 255.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.idx: magic 0x00000801 at offset 0 is not an IDX file of u8 images (expected 0x00000803)"
        );
        let e = read_idx_labels(&idx(0x803, &[1, 1, 1], &[0]), "y.idx").unwrap_err();
        assert!(e.to_string().contains("magic 0x00000803"), "{e}");
        let e = read_idx_labels(&[0, 0, 8, 1, 0], "y.idx").unwrap_err();
        assert_eq!(
            e.to_string(),
            "y.idx: header needs 8 bytes for 1 dimensions but the file has 5"
        );
        let e = read_idx_labels(&idx(0x801, &[3], &[1, 2]), "y.idx").unwrap_err();
        assert_eq!(
            e.to_string(),
            "y.idx: header says 3 labels but file holds 2 bytes of data"
        );
        let e = read_idx_images(&idx(0x803, &[1, 1, 2], &[3, 17]), "d.idx", 16.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "d.idx: pixel value 17 at offset 17 exceeds the maximum 16"
        );
        let e = read_idx_images(&[0, 0], "s.idx", 1.0).unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
        let e = dataset_from_idx(
            read_idx_images(&idx(0x803, &[2, 1, 1], &[0, 0]), "i", 1.0).unwrap(),
            vec![1],
            "i",
            "l",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "l: 1 labels but i holds 2 images");
    }

    #[test]
    fn labels_must_be_below_class_count() {
        let e = Dataset::new(Dims::flat(1), 3, vec![0.0, 0.0], vec![1, 3], "set").unwrap_err();
        assert_eq!(
            e.to_string(),
            "set: label 3 of sample 1 is not below the class count 3"
        );
        let e = Dataset::new(Dims::flat(2), 3, vec![0.0; 3], vec![1, 2], "set").unwrap_err();
        assert!(
            e.to_string().contains("3 values do not make 2 samples"),
            "{e}"
        );
    }

    #[test]
    fn bundled_digits() {
        let (train, test) = digits();
        assert_eq!((train.len(), test.len()), (1437, 360));
        for d in [&train, &test] {
            assert_eq!(d.dims, Dims::new(1, 8, 8));
            assert_eq!(d.classes, 10);
            assert!(d.x.iter().all(|&v| (0.0..=1.0).contains(&v)));
            assert!(d.x.contains(&1.0), "some pixel is at the maximum 16");
        }
        let mut counts = [0usize; 10];
        train.y.iter().for_each(|&l| counts[l as usize] += 1);
        assert_eq!(counts, [136, 154, 151, 135, 143, 143, 151, 153, 138, 133]);
        let mut counts = [0usize; 10];
        test.y.iter().for_each(|&l| counts[l as usize] += 1);
        assert_eq!(counts, [42, 28, 26, 48, 38, 39, 30, 26, 36, 47]);
    }

    #[test]
    fn batch_and_shuffle() {
        let ds = Dataset::new(
            Dims::flat(2),
            5,
            (0..10).map(|v| v as f32).collect(),
            vec![0, 1, 2, 3, 4],
            "s",
        )
        .unwrap();
        let mut xb = [0.0f32; 6];
        let mut yb = [9u32; 4];
        ds.batch(&[4, 0, 2], &mut xb, &mut yb);
        assert_eq!(xb, [8.0, 9.0, 0.0, 1.0, 4.0, 5.0]);
        assert_eq!(yb, [4, 0, 2, 9]);

        let a = ds.shuffle_indices(7, 0);
        assert_eq!(a, ds.shuffle_indices(7, 0), "deterministic");
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4], "a permutation");
        let (train, _) = digits();
        let e0 = train.shuffle_indices(1, 0);
        assert_ne!(e0, train.shuffle_indices(1, 1), "differs between epochs");
        assert_ne!(e0, train.shuffle_indices(2, 0), "differs between seeds");
        assert_ne!(e0, (0..train.len()).collect::<Vec<_>>());
    }

    #[test]
    fn csv_with_and_without_header() {
        let text = b"label,a,b,c,d\n1, 0.5,1,2,3\n\n0,-1,2e-1,0,7\n";
        let ds = parse_csv(text, "t.csv", 0, Some(Dims::new(1, 2, 2))).unwrap();
        assert_eq!((ds.len(), ds.classes, ds.dims), (2, 2, Dims::new(1, 2, 2)));
        assert_eq!(ds.sample(1), (&[-1.0, 0.2, 0.0, 7.0][..], 0));
        let ds = parse_csv(b"1,2,3.0\n4,5,1\n", "t.csv", 2, None).unwrap();
        assert_eq!(ds.dims, Dims::flat(2));
        assert_eq!(ds.y, vec![3, 1]);
        assert_eq!(ds.x, vec![1.0, 2.0, 4.0, 5.0]);
    }

    #[test]
    fn csv_errors_name_line_and_column() {
        let e = parse_csv(b"h1,h2\n1,2\n0,nan\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 3, column 2: \"nan\" is not a finite number"
        );
        let e = parse_csv(b"1,2\n0,inf\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 2, column 2: \"inf\" is not a finite number"
        );
        let e = parse_csv(b"1,2\n0,x\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 2, column 2: \"x\" is not a number"
        );
        let e = parse_csv(b"1,2\n0.5,1\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 2, column 1: label \"0.5\" is not a non-negative integer"
        );
        let e = parse_csv(b"1,2\n0,1,2\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 2: 3 columns, but the first data row has 2"
        );
        let e = parse_csv(b"1,2\n", "t.csv", 2, None).unwrap_err();
        assert!(e.to_string().contains("line 1: label_column 2"), "{e}");
        let e = parse_csv(b"1,2,3\n", "t.csv", 0, Some(Dims::flat(3))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 1: 2 feature columns but the model input 3×1×1 needs 3"
        );
        let e = parse_csv(b"a,b\n", "t.csv", 0, None).unwrap_err();
        assert!(e.to_string().contains("no data rows"), "{e}");
        let e = parse_csv(b"1,2\n\xff,1\n", "t.csv", 0, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv: line 2: not UTF-8 text (byte offset 4)"
        );
        let e = parse_csv(b"1,1e39\n", "t.csv", 0, None).unwrap_err();
        assert!(
            e.to_string().contains("column 2: \"1e39\" overflows f32"),
            "{e}"
        );
    }

    #[test]
    fn files_on_disk() {
        let d = scratch_dir("data");
        std::fs::write(d.join("i.idx"), idx(0x803, &[1, 1, 2], &[255, 0])).unwrap();
        std::fs::write(d.join("l.idx"), idx(0x801, &[1], &[4])).unwrap();
        std::fs::write(d.join("t.csv"), "0,1.5\n1,2.5\n").unwrap();
        let ds = load_idx(&d.join("i.idx"), &d.join("l.idx"), 255.0).unwrap();
        assert_eq!(
            (ds.x.clone(), ds.y.clone(), ds.classes),
            (vec![1.0, 0.0], vec![4], 5)
        );
        let ds = load_csv(&d.join("t.csv"), 0, None).unwrap();
        assert_eq!(ds.y, vec![0, 1]);
        let e = load_csv(&d.join("missing.csv"), 0, None).unwrap_err();
        assert!(e.to_string().contains("missing.csv"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    fn valid_images() -> Vec<u8> {
        idx(0x803, &[3, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_idx_random(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_idx_images(&bytes, "f", 255.0);
            let _ = read_idx_labels(&bytes, "f");
        }

        #[test]
        fn fuzz_idx_random_header(rank in 0u8..6, dims in proptest::collection::vec(any::<u32>(), 0..5),
                                  data in proptest::collection::vec(any::<u8>(), 0..32)) {
            let mut b = vec![0, 0, 8, rank];
            for d in dims { b.extend_from_slice(&d.to_be_bytes()); }
            b.extend_from_slice(&data);
            let _ = read_idx_images(&b, "f", 255.0);
            let _ = read_idx_labels(&b, "f");
        }

        #[test]
        fn fuzz_idx_mutations(muts in proptest::collection::vec((0u8..3, any::<usize>(), any::<u8>()), 1..6)) {
            let _ = read_idx_images(&mutate(valid_images(), &muts), "f", 16.0);
            let _ = read_idx_labels(&mutate(idx(0x801, &[3], &[1, 2, 3]), &muts), "f");
        }

        #[test]
        fn fuzz_csv_random(bytes in proptest::collection::vec(any::<u8>(), 0..128), lc in 0usize..4) {
            let _ = parse_csv(&bytes, "f", lc, None);
            let _ = parse_csv(&bytes, "f", lc, Some(Dims::new(1, 1, 2)));
        }

        #[test]
        fn fuzz_csv_text(text in "[0-9a-z,. \\n+-]{0,120}", lc in 0usize..4) {
            let _ = parse_csv(text.as_bytes(), "f", lc, None);
        }

        #[test]
        fn fuzz_csv_mutations(muts in proptest::collection::vec((0u8..3, any::<usize>(), any::<u8>()), 1..6)) {
            let valid = b"label,a,b\n1,0.5,2\n0,1e-3,-4\n2,3,4\n".to_vec();
            let _ = parse_csv(&mutate(valid, &muts), "f", 0, None);
        }
    }
}
