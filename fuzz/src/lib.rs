//! Helpers shared by the fuzz targets: getting random bytes past the framing (magic, length, CRC-32)
//! so that libFuzzer's mutations land in the payload parsers instead of dying at the checksum.
use frugal_core::format::crc32;

/// Largest arena a target will allocate to run a decoded plan (libFuzzer's RSS limit is 2 GiB).
pub const MAX_RUN_ARENA: usize = 16 << 20;

/// Rewrites the header of a framed file (`magic | version | reserved | len | payload | crc`) so that
/// its payload length and checksum match: the payload is everything between byte 12 and the last 4
/// bytes. Magic and version are kept as mutated (seeds carry valid ones). Returns false when `data`
/// is too short to be a frame.
pub fn repair_frame(data: &mut [u8]) -> bool {
    if data.len() < 16 {
        return false;
    }
    let end = data.len() - 4;
    let len = (end - 12) as u32;
    data[8..12].copy_from_slice(&len.to_le_bytes());
    let crc = crc32(&data[12..end]);
    data[end..].copy_from_slice(&crc.to_le_bytes());
    true
}

/// [`repair_frame`] for plan and plan-table files, which carry the model as a nested frame
/// (`len: u32 | FRGM frame` at the start of the payload): the nested frame is repaired first (when its
/// stated length fits), then the outer one.
pub fn repair_nested(data: &mut [u8]) -> bool {
    if data.len() < 16 {
        return false;
    }
    let end = data.len() - 4;
    let payload = &mut data[12..end];
    if payload.len() >= 4 {
        let n = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
        if let Some(inner) = payload.get_mut(4..4usize.saturating_add(n)) {
            repair_frame(inner);
        }
    }
    repair_frame(data)
}
