//! The channel sequence number: an LCT header extension (HET 250) the sender adds to
//! each packet of a channel, which pressrun's receivers count per channel to tell the
//! loss on the path (`counts::SequenceTrack`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The LCT header extension that carries a channel's packet sequence number: HET 250,
/// a fixed-length (32-bit) extension (RFC 5651 section 5: HET 128..255), the HET then
/// a 24-bit sequence number counted per channel by the sender. Receivers that do not
/// know it skip it (RFC 5651 section 5.2; the crate's `get_ext` walks past it), so a
/// standard FLUTE receiver takes the packets as they are; pressrun's receivers count the
/// gaps per channel to tell the loss on the path.
const HET_CHANNEL_SEQUENCE: u8 = 250;
/// Sequence numbers wrap at 2^24.
pub(crate) const SEQUENCE_MODULO: u32 = 1 << 24;

/// ``packet`` with the channel sequence extension added after its other header
/// extensions (HDR_LEN one word more); None when it is not an LCT packet that can take
/// one (shorter than its header, or a header already 255 words long).
pub(crate) fn with_channel_sequence(packet: &[u8], sequence: u32, out: &mut Vec<u8>) -> bool {
    if packet.len() < 4 || packet[2] == 255 {
        return false;
    }
    let header = (packet[2] as usize) << 2;
    if header > packet.len() {
        return false;
    }
    out.clear();
    out.reserve(packet.len() + 4);
    out.extend_from_slice(&packet[..header]);
    let seq = (sequence % SEQUENCE_MODULO).to_be_bytes();
    out.extend_from_slice(&[HET_CHANNEL_SEQUENCE, seq[1], seq[2], seq[3]]);
    out.extend_from_slice(&packet[header..]);
    out[2] += 1;
    true
}

/// The channel sequence number a packet carries (None: none, or not ALC/LCT).
pub(crate) fn sequence_of(packet: &[u8], lct: &flute::core::lct::LCTHeader) -> Option<u32> {
    match flute::core::lct::get_ext(packet, lct, HET_CHANNEL_SEQUENCE) {
        Ok(Some(ext)) if ext.len() >= 4 => Some(u32::from_be_bytes([0, ext[1], ext[2], ext[3]])),
        _ => None,
    }
}

/// ``packet`` with channel sequence number ``sequence`` (mod 2^24) in an LCT header
/// extension (HET 250) that standard receivers skip.
#[pyfunction]
pub(crate) fn add_channel_sequence<'py>(
    py: Python<'py>,
    packet: &[u8],
    sequence: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    if !with_channel_sequence(packet, sequence, &mut out) {
        return Err(PyValueError::new_err(
            "not an LCT packet that can take another extension",
        ));
    }
    Ok(PyBytes::new(py, &out))
}

/// The channel sequence number of ``packet``, or None when it carries none.
#[pyfunction]
pub(crate) fn channel_sequence(packet: &[u8]) -> Option<u32> {
    let alc = flute::core::alc::parse_alc_pkt(packet).ok()?;
    sequence_of(packet, &alc.lct)
}
