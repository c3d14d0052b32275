//! The weights reader against the `safetensors` crate (the native host's reader): on hand-picked
//! headers and on generated and corrupted files, both accept the same files and read the same values.
use super::*;
use alloc::string::ToString;
use alloc::vec;
use std::collections::BTreeMap;

/// Tensors by name: shape and values.
type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// What the `safetensors` crate reads, as this module would return it (`None`: refused, or a tensor
/// of an element type other than F32, F16 and BF16).
fn reference(bytes: &[u8]) -> Option<Tensors> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes).ok()?;
    let mut out = BTreeMap::new();
    for (name, v) in st.tensors() {
        let elem = match v.dtype() {
            Dtype::F32 => Elem::F32,
            Dtype::F16 => Elem::F16,
            Dtype::BF16 => Elem::Bf16,
            _ => return None,
        };
        out.insert(name, (v.shape().to_vec(), to_f32(elem, v.data())?));
    }
    Some(out)
}

/// Both readers on `bytes`: the same verdict and, when read, the same tensors.
fn same(bytes: &[u8]) {
    let want = reference(bytes);
    let got = parse(bytes);
    let header = String::from_utf8_lossy(&bytes[8.min(bytes.len())..]);
    match (&want, &got) {
        (Some(w), Ok(g)) => {
            let g: Tensors = g
                .iter()
                .map(|(n, s, v)| (n.clone(), (s.clone(), v.clone())))
                .collect();
            // Bit patterns: NaN payloads and signed zeros read the same.
            let bits = |m: &Tensors| {
                m.iter()
                    .map(|(n, (s, v))| {
                        (
                            n.clone(),
                            s.clone(),
                            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&g), bits(w), "{header}");
        }
        (None, Err(_)) => {}
        _ => panic!(
            "safetensors: {}, this reader: {got:?}, header {header:?}",
            want.is_some()
        ),
    }
}

/// A file of `header` followed by `data` bytes (the length field is the header's).
fn file(header: &str, data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend((0..data).map(|i| (i * 37 % 251) as u8));
    b
}

#[test]
fn f32_tensors_round_trip() {
    let t = vec![
        (
            "fc.weight".to_string(),
            vec![2, 3],
            vec![1.0, -2.5, 3.25, 0.0, 1e-7, -0.0],
        ),
        ("fc.bias".to_string(), vec![2], vec![0.5, f32::MAX]),
        ("a \"quoted\"\\ name\n\u{1}é😀".to_string(), vec![0], vec![]),
    ];
    let bytes = serialize(&t).unwrap();
    // The data starts 8-byte aligned; the `safetensors` crate reads the same tensors.
    assert_eq!(
        (8 + u64::from_le_bytes(bytes[..8].try_into().unwrap())) % 8,
        0
    );
    same(&bytes);
    let mut got = parse(&bytes).unwrap();
    got.sort_by(|a, b| b.0.cmp(&a.0));
    let mut want = t.clone();
    want.sort_by(|a, b| b.0.cmp(&a.0));
    assert_eq!(got, want);
    assert!(serialize(&[("w".to_string(), vec![2, 2], vec![0.0; 3])]).is_err());
}

#[test]
fn corrupt_bytes_are_errors_never_panics() {
    let good = serialize(&[("w".to_string(), vec![4], vec![1.0; 4])]).unwrap();
    assert!(parse(&[]).is_err());
    assert!(parse(&good[..good.len() - 1]).is_err());
    assert!(parse(b"\xff\xff\xff\xff\xff\xff\xff\x7f{}").is_err());
    // Every single-byte corruption is read as the `safetensors` crate reads it.
    for i in 0..good.len() {
        for v in [0u8, b'9', b'"', b' ', b'[', b'}', b'-', b'e', 0xff] {
            let mut b = good.clone();
            b[i] = v;
            same(&b);
        }
    }
}

/// Headers where JSON and the header's schema have corners, each with the data its offsets need.
#[test]
fn hand_picked_headers_read_as_the_safetensors_crate_reads_them() {
    let t = |body: &str| format!("{{\"t\":{body}}}");
    let f32x2 = r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    let cases: Vec<(String, usize)> = vec![
        ("{}".into(), 0),
        (" \t\r\n{ } \n".into(), 0),
        ("{}x".into(), 0),
        ("[]".into(), 0),
        ("".into(), 0),
        (t(f32x2), 8),
        (t(f32x2), 7),
        (t(f32x2), 9),
        (t(r#"["F32",[2],[0,8]]"#), 8),
        (t(r#"["F32",[2],[0,8],1]"#), 8),
        (t(r#"["F32",[2]]"#), 8),
        (t(r#"{"dtype":{"F32":null},"shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":{"F32":{}},"shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":{"F32":[]},"shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":{"F32":null,"F16":null},"shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":{},"shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[{"a":[1.5e3,-0,true,null,"\u00e9"]}]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e400}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":0e99999}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":-1e308}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1.7976931348623157e308}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1.7976931348623159e308}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":99999999999999999999999999}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":01}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1.}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":.5}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":tru}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[1,]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}"#), 0),
        (t(r#"{"dtype":"F32","shape":[0],"data_offsets":[0,0]}"#), 0),
        (t(r#"{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0]}"#), 0),
        (t(r#"{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}"#), 0),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}"#), 8),
        (t(r#"{"dtype":"F32","shape":[2],"data_offsets":[8,0]}"#), 8),
        (t(r#"{"dtype":"I8","shape":[2],"data_offsets":[0,2]}"#), 2),
        (t(r#"{"dtype":"F4","shape":[3],"data_offsets":[0,1]}"#), 1),
        (t(r#"{"dtype":"f32","shape":[2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}"#), 8),
        (t(r#"{"dtype":"F16","shape":[],"data_offsets":[0,2]}"#), 2),
        (t("null"), 0),
        (r#"{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#.into(), 2),
        (r#"{"a":{"dtype":"X","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#.into(), 2),
        (r#"{"a":{"dtype":"F16","shape":[1],"data_offsets":[2,4]},"b":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#.into(), 4),
        (r#"{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}"#.into(), 4),
        (r#"{"a":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F16","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"__metadata__":{"k":"v","k":"w"}}"#.into(), 0),
        (r#"{"__metadata__":null}"#.into(), 0),
        (r#"{"__metadata__":{"k":1}}"#.into(), 0),
        (r#"{"__metadata__":[]}"#.into(), 0),
        (r#"{"__metadata__":{},"__metadata__":{}}"#.into(), 0),
        (r#"{"\u00e9\ud83d\ude00\n\/":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"\ud83d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"\ud83d\u0041":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"\ude00":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"\x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"\u12G4":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#.into(), 0),
        ("{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}".into(), 0),
        ("{\"a\u{7f}b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}".into(), 0),
    ];
    for (h, data) in &cases {
        same(&file(h, *data));
    }
    // serde_json's recursion limit: 127 containers deep read, 128 refused.
    for depth in [126, 127, 128] {
        let x = "[".repeat(depth - 2) + &"]".repeat(depth - 2);
        same(&file(
            &t(&format!(
                r#"{{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":{x}}}"#
            )),
            0,
        ));
    }
    // A header length beyond the file, and beyond the largest header.
    let mut b = file("{}", 0);
    b[..8].copy_from_slice(&3u64.to_le_bytes());
    same(&b);
    b[..8].copy_from_slice(&200_000_000u64.to_le_bytes());
    same(&b);
    same(&[1, 0, 0]);
}

/// Generated files (tensors in both forms, names with escapes, unknown fields, metadata; offsets and
/// data lengths right or off), each also corrupted by a byte replaced, inserted or removed.
#[test]
fn generated_and_corrupted_files_read_as_the_safetensors_crate_reads_them() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as usize) % n
    };
    const NAMES: [&str; 6] = ["a", "b", "a", "x\\\"y", "\\u00e9\\n", "__metadata__"];
    const DTYPES: [(&str, usize); 7] = [
        ("F32", 4),
        ("F16", 2),
        ("BF16", 2),
        ("I8", 1),
        ("F64", 8),
        ("X9", 1),
        ("f16", 2),
    ];
    const JUNK: [&str; 6] = [
        "1",
        "-2.5e-3",
        "[1,[2,{}]]",
        "{\"k\":null}",
        "\"s\"",
        "true",
    ];
    const BYTES: [u8; 12] = [
        b'{', b'}', b'[', b']', b',', b':', b'"', b'0', b'9', b'-', b' ', b'\\',
    ];
    for _ in 0..4000 {
        let mut h = String::from("{");
        let mut at = 0;
        let n = rnd(4);
        if rnd(4) == 0 {
            h.push_str(["\"__metadata__\":{\"k\":\"v\"},", "\"__metadata__\":null,"][rnd(2)]);
        }
        for i in 0..n {
            if i > 0 {
                h.push(',');
            }
            let (dtype, size) = DTYPES[rnd(DTYPES.len())];
            let shape: Vec<usize> = (0..rnd(3)).map(|_| rnd(4)).collect();
            let bytes = shape.iter().product::<usize>() * size + usize::from(rnd(10) == 0);
            let (s, e) = if rnd(10) == 0 {
                (rnd(8), rnd(8))
            } else {
                (at, at + bytes)
            };
            at = at.max(e);
            let shape_s = shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let name = NAMES[rnd(NAMES.len())];
            if rnd(4) == 0 {
                h.push_str(&format!("\"{name}\":[\"{dtype}\",[{shape_s}],[{s},{e}]]"));
            } else {
                let junk = if rnd(3) == 0 {
                    format!(",\"extra\":{}", JUNK[rnd(JUNK.len())])
                } else {
                    String::new()
                };
                h.push_str(&format!(
                    "\"{name}\": {{\"data_offsets\":[{s},{e}]{junk},\"shape\":[{shape_s}], \"dtype\":\"{dtype}\"}}"
                ));
            }
        }
        h.push('}');
        let data = if rnd(8) == 0 { at + 1 } else { at };
        let b = file(&h, data);
        same(&b);
        // One corruption of the header.
        let mut c = b.clone();
        let i = 8 + rnd(h.len());
        match rnd(3) {
            0 => c[i] = BYTES[rnd(BYTES.len())],
            1 => {
                c.insert(i, BYTES[rnd(BYTES.len())]);
                let len = u64::from_le_bytes(c[..8].try_into().unwrap()) + 1;
                c[..8].copy_from_slice(&len.to_le_bytes());
            }
            _ => {
                c.remove(i);
                let len = u64::from_le_bytes(c[..8].try_into().unwrap()) - 1;
                c[..8].copy_from_slice(&len.to_le_bytes());
            }
        }
        same(&c);
    }
}
