//! The framed pipe protocol between host and skel. Must agree with `dsp/proto.h` constant for
//! constant. Request: `magic, op, seq, nparam, payload_len, checksum`, the parameters (u32), the
//! payload; reply: `magic, status, seq, nresult, payload_len, checksum`, the results (u32), the
//! payload. Little-endian; the checksum is FNV-1a (32-bit) over the parameter/result bytes then the
//! payload bytes.

/// Request magic ("FHXR").
pub const REQ_MAGIC: u32 = 0x5258_4846;
/// Reply magic ("FHXA").
pub const RSP_MAGIC: u32 = 0x4158_4846;
/// Header words of a frame.
pub const HEADER_WORDS: usize = 6;
/// Most parameters a request carries.
pub const MAX_PARAMS: usize = 32;
/// [`Op::InSpace`]: set in the inner op's word, the output stays in the DSP space (none comes back).
pub const QUIET: u32 = 0x8000_0000;
/// Most results a reply carries.
pub const MAX_RESULTS: usize = 4;
/// The protocol version the skel answers to a ping.
pub const VERSION: u32 = 2;
/// The skel's working memory (`ARENA_BYTES` in `dsp/skel.c`): a request's payload and its result
/// must fit in it together.
pub const SKEL_ARENA: u64 = 96 << 20;

/// The skel's operations (`enum fhx_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// Results: the protocol version.
    Ping = 1,
    /// `C = (acc ? C : 0) + A·B`, strided A and B.
    Gemm = 2,
    /// i32 → i8 with a shift (nearest or stochastic rounding).
    Rescale = 3,
    /// `max |x|` of i32 values.
    MaxAbs = 4,
    /// 2×2 max-pool of row pairs.
    MaxPool = 5,
    /// Its backward.
    MaxPoolGrad = 6,
    /// f32 → i8 by a power-of-two scale.
    Quantize = 7,
    /// im2col of one group of a convolution.
    Im2col = 8,
    /// The skel exits after answering.
    Exit = 9,
    /// Frees the DSP space and maps a zeroed one of the given bytes (once per plan).
    Prepare = 10,
    /// Writes spans of the DSP space.
    Write = 11,
    /// Runs another op on operands gathered from the DSP space, scattering its output there too.
    InSpace = 12,
    /// FNV-1a of the whole DSP space (tests: the host's record of it agrees).
    SpaceSum = 13,
    /// Never answers (tests: a hung DSP).
    Hang = 14,
}

impl Op {
    /// Its name in errors and reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Gemm => "gemm",
            Op::Rescale => "rescale",
            Op::MaxAbs => "max-abs",
            Op::MaxPool => "max-pool",
            Op::MaxPoolGrad => "max-pool backward",
            Op::Quantize => "quantise",
            Op::Im2col => "im2col",
            Op::Exit => "exit",
            Op::Prepare => "prepare",
            Op::Write => "space write",
            Op::InSpace => "in-space call",
            Op::SpaceSum => "space checksum",
            Op::Hang => "hang",
        }
    }
}

/// FNV-1a, 32-bit, continued from `h`.
pub fn fnv(mut h: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        h = (h ^ b as u32).wrapping_mul(16_777_619);
    }
    h
}

/// FNV-1a's starting value.
pub const FNV_INIT: u32 = 2_166_136_261;

/// One request: the operation, its parameters and its payload in pieces (sent back to back).
pub struct Request<'a> {
    /// The operation.
    pub op: Op,
    /// Its parameters (at most [`MAX_PARAMS`]).
    pub params: &'a [u32],
    /// Its payload, in pieces.
    pub payload: &'a [&'a [u8]],
    /// The reply payload's length the caller expects (a transport refuses another one early and
    /// sizes its reply buffer from it).
    pub reply_len: usize,
}

/// The whole request frame (header, parameters, payload) in `out`, cleared first (FastRPC passes it
/// as one buffer; the pipe sends the pieces instead).
pub fn request_frame(req: &Request<'_>, seq: u32, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&request_header(req, seq));
    for p in req.params {
        out.extend_from_slice(&p.to_le_bytes());
    }
    for piece in req.payload {
        out.extend_from_slice(piece);
    }
}

/// Parses a whole reply frame `b` (FastRPC's output buffer) for request `seq` into `reply`.
pub fn parse_reply_frame(
    b: &[u8],
    seq: u32,
    reply: &mut Reply,
) -> Result<ReplyHeader, &'static str> {
    let hb: &[u8; HEADER_WORDS * 4] = b
        .get(..HEADER_WORDS * 4)
        .and_then(|h| h.try_into().ok())
        .ok_or("shorter than a header")?;
    let h = parse_reply_header(hb)?;
    if h.seq != seq {
        return Err("answers another request");
    }
    let rn = h.nresults as usize * 4;
    let body = &b[HEADER_WORDS * 4..];
    if body.len() != rn + h.len as usize {
        return Err("frame length differs from its header");
    }
    let (rb, pb) = body.split_at(rn);
    if fnv(fnv(FNV_INIT, rb), pb) != h.sum {
        return Err("checksum mismatch");
    }
    reply.nresults = h.nresults as usize;
    for (r, w) in reply.results.iter_mut().zip(rb.chunks_exact(4)) {
        *r = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    reply.payload.clear();
    reply.payload.extend_from_slice(pb);
    Ok(h)
}

/// One reply, reused across calls (its buffer keeps its capacity: no allocation once warm).
#[derive(Default)]
pub struct Reply {
    /// The results (the first `nresults`).
    pub results: [u32; MAX_RESULTS],
    /// How many results.
    pub nresults: usize,
    /// The payload.
    pub payload: Vec<u8>,
}

/// The request header (its words, little-endian) for `req` with sequence number `seq`.
pub fn request_header(req: &Request<'_>, seq: u32) -> [u8; HEADER_WORDS * 4] {
    let mut sum = FNV_INIT;
    for p in req.params {
        sum = fnv(sum, &p.to_le_bytes());
    }
    let mut len = 0u64;
    for piece in req.payload {
        sum = fnv(sum, piece);
        len += piece.len() as u64;
    }
    let words = [
        REQ_MAGIC,
        req.op as u32,
        seq,
        req.params.len() as u32,
        len as u32,
        sum,
    ];
    let mut out = [0u8; HEADER_WORDS * 4];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// A reply header, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    /// Status (0: ok).
    pub status: u32,
    /// Sequence number it answers.
    pub seq: u32,
    /// Results that follow.
    pub nresults: u32,
    /// Payload bytes that follow the results.
    pub len: u32,
    /// Checksum of results and payload.
    pub sum: u32,
}

/// Parses a reply header; `Err(what)` when it cannot be one.
pub fn parse_reply_header(b: &[u8; HEADER_WORDS * 4]) -> Result<ReplyHeader, &'static str> {
    let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    if w(0) != RSP_MAGIC {
        return Err("wrong magic");
    }
    let h = ReplyHeader {
        status: w(1),
        seq: w(2),
        nresults: w(3),
        len: w(4),
        sum: w(5),
    };
    if h.nresults as usize > MAX_RESULTS {
        return Err("too many results");
    }
    if h.len as u64 > SKEL_ARENA {
        return Err("payload longer than the DSP's memory");
    }
    Ok(h)
}
