//! Weights in and out as safetensors bytes (PyTorch `state_dict` names), the format the native host's
//! checkpoints use. Loading accepts F32, F16 and BF16 tensors; saving writes F32. Errors are the
//! message; each host wraps it in its own error type.
//!
//! The header is read by the small JSON reader below rather than by the `safetensors` crate (with
//! serde and serde_json, about 30 KB of the CPU browser module, which has a size limit). It accepts
//! exactly the files the `safetensors` crate (0.8, which the native host reads checkpoints with)
//! accepts and whose tensors are F32, F16 or BF16: the same JSON (serde_json's grammar, its recursion
//! limit of 128, its number range), the same header fields (`__metadata__` strings, a tensor's
//! `dtype`, `shape`, `data_offsets`, as an object or a 3-element array, unknown fields ignored, a
//! repeated tensor name keeping the last) and the same checks (offsets contiguous from 0, each
//! tensor's bytes its shape × element size, the data ending the file). The tests compare the two on
//! generated and corrupted files; the fuzz target `safetensors` compares them with libFuzzer.
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use frugal_core::format::tensor::{f32_bytes, to_f32, Elem};

/// One tensor: name, shape (row-major), values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// The `safetensors` crate's largest header.
const MAX_HEADER: usize = 100_000_000;
/// serde_json's recursion limit: containers nested this deep are an error.
const MAX_DEPTH: u32 = 128;
/// Every element type name of the safetensors format, with its bits (a file naming another is
/// invalid; one naming a type other than F32, F16 and BF16 is valid but not supported here).
const DTYPES: [(&str, usize); 22] = [
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("F8_E4M3FNUZ", 8),
    ("F8_E5M2FNUZ", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
];

/// A tensor's header entry.
struct Info {
    /// Index into [`DTYPES`].
    dtype: usize,
    shape: Vec<usize>,
    offsets: (usize, usize),
}

/// Parses safetensors bytes into f32 tensors (in the order of their data). Never panics, whatever the
/// bytes.
pub fn parse(bytes: &[u8]) -> Result<Vec<NamedTensor>, String> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Err("the header is too small".into());
    };
    let n = u64::from_le_bytes(*len);
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_HEADER)
        .ok_or("the header is too large")?;
    let (header, data) = rest
        .split_at_checked(n)
        .ok_or("the header length is invalid")?;
    let header = core::str::from_utf8(header).map_err(|_| "the header is not UTF-8")?;
    let mut tensors = Json::new(header.as_bytes()).header()?;
    // A repeated name keeps its last entry (a map): reversed, then stably by name, the first of each
    // name is the last given.
    tensors.reverse();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors.dedup_by(|a, b| a.0 == b.0);
    // By offsets: the order the `safetensors` crate validates in.
    tensors.sort_by_key(|(_, i)| i.offsets);
    let mut end = 0;
    for (name, info) in &tensors {
        let (s, e) = info.offsets;
        if s != end || e < s {
            return Err(format!("tensor \"{name}\": invalid data offsets"));
        }
        end = e;
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(DTYPES[info.dtype].1))
            .ok_or_else(|| format!("tensor \"{name}\": its size overflows"))?;
        if bits % 8 != 0 || e - s != bits / 8 {
            return Err(format!(
                "tensor \"{name}\": its data offsets do not match its shape"
            ));
        }
    }
    if end != data.len() {
        return Err("the data does not end the file".into());
    }
    let mut out = Vec::with_capacity(tensors.len());
    for (name, info) in tensors {
        let elem = match DTYPES[info.dtype].0 {
            "F32" => Elem::F32,
            "F16" => Elem::F16,
            "BF16" => Elem::Bf16,
            other => {
                return Err(format!(
                "tensor \"{name}\" has element type {other}; only F32, F16 and BF16 are supported"
            ))
            }
        };
        // Checked above: the data holds shape × element size bytes.
        let values = to_f32(elem, &data[info.offsets.0..info.offsets.1])
            .ok_or_else(|| format!("tensor \"{name}\": a partial element"))?;
        out.push((name, info.shape, values));
    }
    Ok(out)
}

/// Encodes tensors as F32 safetensors bytes (in the given order; the header padded with spaces so
/// that the data starts 8-byte aligned, as the `safetensors` crate writes it).
pub fn serialize(tensors: &[NamedTensor]) -> Result<Vec<u8>, String> {
    let mut h = String::from("{");
    let mut at = 0usize;
    for (i, (name, shape, values)) in tensors.iter().enumerate() {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(values.len()) {
            return Err(format!(
                "tensor \"{name}\": {} values for shape {shape:?}",
                values.len()
            ));
        }
        if i > 0 {
            h.push(',');
        }
        json_string(&mut h, name);
        h.push_str(":{\"dtype\":\"F32\",\"shape\":[");
        for (j, d) in shape.iter().enumerate() {
            if j > 0 {
                h.push(',');
            }
            h.push_str(&format!("{d}"));
        }
        let end = at + 4 * values.len();
        h.push_str(&format!("],\"data_offsets\":[{at},{end}]}}"));
        at = end;
    }
    h.push('}');
    while h.len() % 8 != 0 {
        h.push(' ');
    }
    if h.len() > MAX_HEADER {
        return Err("the header is too large".into());
    }
    let mut out = Vec::with_capacity(8 + h.len() + at);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    for (_, _, v) in tensors {
        out.extend_from_slice(&f32_bytes(v));
    }
    Ok(out)
}

/// `s` as a JSON string (quoted, escaped).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What a JSON number is to a `usize` field.
enum Number {
    /// A non-negative integer within u64 (serde_json's `u64`).
    Unsigned(u64),
    /// A negative integer, a fraction, an exponent or a larger integer (not a `usize`).
    Other,
}

/// A JSON reader over a header, with serde_json's grammar and limits.
struct Json<'a> {
    b: &'a [u8],
    i: usize,
    depth: u32,
}

const BAD: &str = "the header is not valid JSON";

impl<'a> Json<'a> {
    fn new(b: &'a [u8]) -> Self {
        Json { b, i: 0, depth: 0 }
    }

    /// The next byte after whitespace (not consumed).
    fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(BAD.into())
        }
    }

    /// Enters an object or array (its opening byte `c`).
    fn open(&mut self, c: u8) -> Result<(), String> {
        self.eat(c)?;
        self.depth += 1;
        if self.depth >= MAX_DEPTH {
            return Err("the header nests too deep".into());
        }
        Ok(())
    }

    /// Whether a container has another element: `first` on the first call; consumes the separating
    /// comma, or the closing byte `close` (leaving the container).
    fn more(&mut self, first: &mut bool, close: u8) -> Result<bool, String> {
        let c = self.peek();
        if c == Some(close) {
            self.i += 1;
            self.depth -= 1;
            return Ok(false);
        }
        if core::mem::take(first) {
            return Ok(true);
        }
        self.eat(b',').map(|_| true)
    }

    /// An object key and its colon.
    fn key(&mut self) -> Result<String, String> {
        let k = self.string()?;
        self.eat(b':')?;
        Ok(k)
    }

    /// The whole header: the top-level object.
    fn header(&mut self) -> Result<Vec<(String, Info)>, String> {
        let mut tensors: Vec<(String, Info)> = Vec::new();
        let mut metadata = false;
        self.open(b'{')?;
        let mut first = true;
        while self.more(&mut first, b'}')? {
            let name = self.key()?;
            if name == "__metadata__" {
                if core::mem::replace(&mut metadata, true) {
                    return Err("the header repeats __metadata__".into());
                }
                self.metadata()?;
                continue;
            }
            tensors.push((name, self.info()?));
        }
        if self.peek().is_some() {
            return Err(BAD.into());
        }
        Ok(tensors)
    }

    /// `__metadata__`: null or an object of strings.
    fn metadata(&mut self) -> Result<(), String> {
        if self.peek() == Some(b'n') {
            return self.literal("null");
        }
        self.open(b'{')?;
        let mut first = true;
        while self.more(&mut first, b'}')? {
            self.key()?;
            self.string()?;
        }
        Ok(())
    }

    /// A tensor's entry: an object with `dtype`, `shape` and `data_offsets` (others ignored; each at
    /// most once) or the array `[dtype, shape, data_offsets]`.
    fn info(&mut self) -> Result<Info, String> {
        if self.peek() == Some(b'[') {
            self.open(b'[')?;
            let mut first = true;
            let mut next = |j: &mut Self| match j.more(&mut first, b']') {
                Ok(true) => Ok(()),
                Ok(false) => Err(String::from("a tensor's entry has too few fields")),
                Err(e) => Err(e),
            };
            next(self)?;
            let dtype = self.dtype()?;
            next(self)?;
            let shape = self.shape()?;
            next(self)?;
            let offsets = self.offsets()?;
            if self.more(&mut first, b']')? {
                return Err("a tensor's entry has too many fields".into());
            }
            return Ok(Info {
                dtype,
                shape,
                offsets,
            });
        }
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        self.open(b'{')?;
        let mut first = true;
        while self.more(&mut first, b'}')? {
            let k = self.key()?;
            let dup = match k.as_str() {
                "dtype" => dtype.replace(self.dtype()?).is_some(),
                "shape" => shape.replace(self.shape()?).is_some(),
                "data_offsets" => offsets.replace(self.offsets()?).is_some(),
                _ => {
                    self.value()?;
                    false
                }
            };
            if dup {
                return Err(format!("a tensor's entry repeats {k}"));
            }
        }
        match (dtype, shape, offsets) {
            (Some(dtype), Some(shape), Some(offsets)) => Ok(Info {
                dtype,
                shape,
                offsets,
            }),
            _ => Err("a tensor's entry lacks dtype, shape or data_offsets".into()),
        }
    }

    /// An element type: its name, or (serde's enum form) `{"NAME": null}`.
    fn dtype(&mut self) -> Result<usize, String> {
        let name = if self.peek() == Some(b'{') {
            self.open(b'{')?;
            let name = self.key()?;
            self.literal("null")?;
            let mut first = false;
            if self.more(&mut first, b'}')? {
                return Err("an element type has more than one key".into());
            }
            name
        } else {
            self.string()?
        };
        DTYPES
            .iter()
            .position(|(n, _)| *n == name)
            .ok_or_else(|| format!("unknown element type {name:?}"))
    }

    fn usize(&mut self) -> Result<usize, String> {
        match self.number()? {
            Number::Unsigned(v) => usize::try_from(v).map_err(|_| "a size is too large".into()),
            Number::Other => Err("a size is not a non-negative integer".into()),
        }
    }

    fn shape(&mut self) -> Result<Vec<usize>, String> {
        let mut shape = Vec::new();
        self.open(b'[')?;
        let mut first = true;
        while self.more(&mut first, b']')? {
            shape.push(self.usize()?);
        }
        Ok(shape)
    }

    fn offsets(&mut self) -> Result<(usize, usize), String> {
        self.open(b'[')?;
        let mut first = true;
        let mut v = [0usize; 2];
        for x in &mut v {
            if !self.more(&mut first, b']')? {
                return Err("data_offsets needs two numbers".into());
            }
            *x = self.usize()?;
        }
        if self.more(&mut first, b']')? {
            return Err("data_offsets needs two numbers".into());
        }
        Ok((v[0], v[1]))
    }

    /// Any JSON value (checked, discarded).
    fn value(&mut self) -> Result<(), String> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'{') => {
                self.open(b'{')?;
                let mut first = true;
                while self.more(&mut first, b'}')? {
                    self.key()?;
                    self.value()?;
                }
                Ok(())
            }
            Some(b'[') => {
                self.open(b'[')?;
                let mut first = true;
                while self.more(&mut first, b']')? {
                    self.value()?;
                }
                Ok(())
            }
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            _ => self.number().map(|_| ()),
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), String> {
        self.peek();
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(())
        } else {
            Err(BAD.into())
        }
    }

    /// A number (JSON's grammar); an error where serde_json's is: a float beyond f64's range.
    fn number(&mut self) -> Result<Number, String> {
        self.peek();
        let b = self.b;
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - s
        };
        let mut i = self.i;
        let negative = b.get(i) == Some(&b'-');
        i += usize::from(negative);
        let int = i;
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return Err(BAD.into()),
        }
        let int_end = i;
        let mut frac = (i, i);
        if b.get(i) == Some(&b'.') {
            i += 1;
            let s = i;
            if digits(&mut i) == 0 {
                return Err(BAD.into());
            }
            frac = (s, i);
        }
        let mut exp: i64 = 0;
        let has_exp = matches!(b.get(i), Some(b'e' | b'E'));
        if has_exp {
            i += 1;
            let neg = b.get(i) == Some(&b'-');
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let s = i;
            if digits(&mut i) == 0 {
                return Err(BAD.into());
            }
            for &d in &b[s..i] {
                // Saturates far beyond any f64 exponent.
                exp = (exp * 10 + i64::from(d - b'0')).min(1 << 40);
            }
            if neg {
                exp = -exp;
            }
        }
        self.i = i;
        let int_digits = &b[int..int_end];
        if !negative && !has_exp && frac.0 == frac.1 {
            let mut v: u64 = 0;
            let fits = int_digits.iter().all(|&d| {
                v.checked_mul(10)
                    .and_then(|x| x.checked_add(u64::from(d - b'0')))
                    .map(|x| v = x)
                    .is_some()
            });
            if fits {
                return Ok(Number::Unsigned(v));
            }
        }
        // A float: out of range where its value rounds beyond f64::MAX (serde_json's error). The
        // significant digits and the power of ten of the first one.
        let all = int_digits.iter().chain(&b[frac.0..frac.1]);
        let lead = all.clone().take_while(|&&d| d == b'0').count();
        let sig: Vec<u8> = all.skip(lead).copied().collect();
        if sig.is_empty() {
            return Ok(Number::Other); // zero, whatever its exponent
        }
        let top = int_digits.len() as i64 - 1 - lead as i64 + exp; // value in [10^top, 10^(top+1))
                                                                   // f64::MAX rounds up to infinity from the midpoint to the next power of two, 2^1024 - 2^970.
        const MID: &[u8] = b"17976931348623158079372897140530341507993413271003782693617377898044496829276475094664736";
        let over = match top.cmp(&308) {
            core::cmp::Ordering::Less => false,
            core::cmp::Ordering::Greater => true,
            core::cmp::Ordering::Equal => {
                let sig = &sig[..sig.len() - sig.iter().rev().take_while(|&&d| d == b'0').count()];
                sig >= MID
            }
        };
        if over {
            return Err("a number in the header is out of range".into());
        }
        Ok(Number::Other)
    }

    /// A string (JSON escapes decoded; control characters and lone surrogates are errors).
    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = String::new();
        loop {
            let s = self.i;
            while self
                .b
                .get(self.i)
                .is_some_and(|&c| c != b'"' && c != b'\\' && c >= 0x20)
            {
                self.i += 1;
            }
            // The header is UTF-8 and the run stops at ASCII bytes.
            out.push_str(core::str::from_utf8(&self.b[s..self.i]).map_err(|_| BAD)?);
            match self.b.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let e = self.b.get(self.i).copied();
                    self.i += 1;
                    out.push(match e {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if !self.b[self.i..].starts_with(b"\\u") {
                                    return Err(BAD.into());
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(BAD.into());
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(c).ok_or(BAD)?
                        }
                        _ => return Err(BAD.into()),
                    });
                }
                _ => return Err(BAD.into()), // a control character or the end
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self.b.get(self.i..self.i + 4).ok_or(BAD)?;
        self.i += 4;
        h.iter().try_fold(0u32, |a, &c| {
            let d = (c as char).to_digit(16).ok_or(BAD)?;
            Ok(a * 16 + d)
        })
    }
}

#[cfg(test)]
#[path = "weights_tests.rs"]
mod tests;
