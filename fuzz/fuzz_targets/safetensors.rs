//! Safetensors weights, as the native host (checkpoints) and the browser (`weights::parse`) read them.
//! Structure-aware: besides raw bytes, an `arbitrary` list of tensors (name, dtype, shape, offsets,
//! data) is written as a header the parser's JSON reader accepts, so inputs reach the dtype
//! conversion and shape checks rather than stopping at the JSON.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Tensor {
    name: String,
    dtype: u8,
    shape: Vec<u8>,
    begin: u16,
    end: u16,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Built {
        tensors: Vec<Tensor>,
        metadata: Option<Vec<(String, String)>>,
        data: Vec<u8>,
    },
}

const DTYPES: [&str; 8] = ["F32", "F16", "BF16", "F64", "I8", "U8", "I64", "BOOL"];

fn build(tensors: &[Tensor], metadata: &Option<Vec<(String, String)>>, data: &[u8]) -> Vec<u8> {
    let mut h = String::from("{");
    let mut first = true;
    let mut sep = |h: &mut String| {
        if !first {
            h.push(',');
        }
        first = false;
    };
    if let Some(m) = metadata {
        sep(&mut h);
        h.push_str("\"__metadata__\":{");
        for (i, (k, v)) in m.iter().enumerate() {
            if i > 0 {
                h.push(',');
            }
            h.push_str(&format!("{k:?}:{v:?}"));
        }
        h.push('}');
    }
    for t in tensors {
        sep(&mut h);
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        h.push_str(&format!(
            "{:?}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            t.name,
            DTYPES[t.dtype as usize % DTYPES.len()],
            shape.join(","),
            t.begin,
            t.end
        ));
    }
    h.push('}');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

fuzz_target!(|input: Input| {
    let bytes = match &input {
        Input::Raw(b) => b.clone(),
        Input::Built {
            tensors,
            metadata,
            data,
        } => build(tensors, metadata, data),
    };
    let native = frugal_cli::checkpoint::parse_safetensors(&bytes, "fuzz.safetensors");
    let _ = frugal_cli::checkpoint::parse_safetensors_metadata(&bytes, "fuzz.safetensors");
    let web = frugal_wasm::weights::parse(&bytes);
    assert_eq!(native.is_ok(), web.is_ok(), "the two readers disagree");
    if let Ok(ts) = web {
        // What was read writes back and reads the same.
        let again = frugal_wasm::weights::serialize(&ts).expect("read tensors serialize");
        let back = frugal_wasm::weights::parse(&again).expect("written tensors parse");
        assert_eq!(back.len(), ts.len());
    }
});
