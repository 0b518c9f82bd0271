//! A pass of an object for the sender: its ALC/LCT packets with each one's (SBN, ESI)
//! (`encode_object`) and its FDT built again with a fresh Expires (`encode_fdt`), both
//! by the crate's `Sender`, the object in carousel mode.

use std::time::{Duration, SystemTime};

use flute::core::Oti;
use flute::sender::{
    CarouselRepeatMode, Config as SenderConfig, ObjectDataSource, ObjectDesc, Sender,
    TransferConfig,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{flute_err, session_endpoint};

/// One pass of an object: the FDT packets and the object's packets, in the order the
/// crate's sender produced them, with each object packet's source block and ESI.
#[pyclass(frozen, module = "pressrun_flute")]
pub(crate) struct EncodedObject {
    #[pyo3(get)]
    toi: u128,
    #[pyo3(get)]
    tsi: u64,
    #[pyo3(get)]
    fec: String,
    #[pyo3(get)]
    transfer_length: u64,
    #[pyo3(get)]
    encoding_symbol_length: u16,
    /// the object's Content-MD5 (base64) as the FDT names it, for `encode_fdt`
    #[pyo3(get)]
    content_md5: Option<String>,
    /// the FDT Instance ID of ``fdt_packets``
    #[pyo3(get)]
    fdt_instance_id: u32,
    /// source symbols of each source block, in SBN order
    #[pyo3(get)]
    block_source_symbols: Vec<u32>,
    #[pyo3(get)]
    fdt_packets: Vec<Py<PyBytes>>,
    #[pyo3(get)]
    packets: Vec<Py<PyBytes>>,
    #[pyo3(get)]
    sbns: Vec<u32>,
    #[pyo3(get)]
    esis: Vec<u32>,
}

#[pymethods]
impl EncodedObject {
    /// Source symbols of the whole object (the sum over its blocks).
    #[getter]
    fn source_symbols(&self) -> u64 {
        self.block_source_symbols.iter().map(|&k| k as u64).sum()
    }

    fn __repr__(&self) -> String {
        format!(
            "EncodedObject(toi={}, tsi={}, fec={:?}, transfer_length={}, blocks={}, packets={}, fdt_packets={})",
            self.toi,
            self.tsi,
            self.fec,
            self.transfer_length,
            self.block_source_symbols.len(),
            self.packets.len(),
            self.fdt_packets.len()
        )
    }
}

/// The object's FEC Object Transmission Information from the binding's arguments.
///
/// RaptorQ's repair symbols per block may pass 65535 (the crate's constructor takes a
/// u16, its `Oti` keeps a u32): a block's ESIs are 24 bits (RFC 6330 section 3.2), so
/// K + repair symbols below 2^24. A carousel of one large block on 10 channels
/// precomputes K x 10 x 1.35 symbols of it (docs/multicast.md, "Source blocks").
fn object_oti(
    fec: &str,
    encoding_symbol_length: u16,
    max_source_block_length: u16,
    repair_symbols_per_block: u32,
) -> PyResult<Oti> {
    match fec {
        "raptorq" => {
            if max_source_block_length as u64 + repair_symbols_per_block as u64 >= 1 << 24 {
                return Err(PyValueError::new_err(format!(
                    "{max_source_block_length} source and {repair_symbols_per_block} repair \
                     symbols a block: RaptorQ's ESIs are 24 bits"
                )));
            }
            let mut oti = Oti::new_raptorq(
                encoding_symbol_length,
                max_source_block_length,
                repair_symbols_per_block.min(u16::MAX as u32) as u16,
                1,
                4,
            )
            .map_err(|e| flute_err("RaptorQ parameters", e))?;
            oti.max_number_of_parity_symbols = repair_symbols_per_block;
            Ok(oti)
        }
        "none" => {
            if repair_symbols_per_block != 0 {
                return Err(PyValueError::new_err(
                    "fec 'none' has no repair symbols: repair_symbols_per_block must be 0",
                ));
            }
            Ok(Oti::new_no_code(
                encoding_symbol_length,
                max_source_block_length,
            ))
        }
        other => Err(PyValueError::new_err(format!(
            "unknown fec {other:?}: use 'raptorq' or 'none'"
        ))),
    }
}

/// The crate's FLUTE sender for one object: the FDT Instance ``fdt_instance_id``
/// expires ``fdt_duration_s`` after ``now``, and its packets carry the Sender Current
/// Time (EXT_TIME, RFC 6726 section 3.3.2) of ``now``, so a receiver judges the expiry
/// by the sender's clock, not its own.
/// The object's OTI and Content-Location, checked: TOI 0 is the FDT's, and the
/// location must be a URL (`encode_object` and `encode_fdt` describe the same object).
fn object_plan(
    toi: u128,
    fec: &str,
    encoding_symbol_length: u16,
    max_source_block_length: u16,
    repair_symbols_per_block: u32,
    content_location: &str,
) -> PyResult<(Oti, url::Url)> {
    if toi == 0 {
        return Err(PyValueError::new_err(
            "TOI 0 is the FDT's; give the object a TOI above 0",
        ));
    }
    let oti = object_oti(
        fec,
        encoding_symbol_length,
        max_source_block_length,
        repair_symbols_per_block,
    )?;
    let location = url::Url::parse(content_location).map_err(|e| {
        PyValueError::new_err(format!("content_location {content_location:?}: {e}"))
    })?;
    Ok((oti, location))
}

fn object_sender(
    tsi: u64,
    toi: u128,
    encoding_symbol_length: u16,
    fdt_instance_id: u32,
    fdt_duration_s: u64,
    sender_current_time: bool,
) -> Sender {
    let config = SenderConfig {
        fdt_duration: Duration::from_secs(fdt_duration_s),
        fdt_start_id: fdt_instance_id & 0xFFFFF,
        fdt_inband_sct: sender_current_time,
        toi_initial_value: Some(toi),
        ..Default::default()
    };
    // the FDT itself is sent with no-code (FIELD-NOTES trap 3); the object has its OTI
    let fdt_oti = Oti::new_no_code(encoding_symbol_length, 64);
    Sender::new(session_endpoint(), tsi, &fdt_oti, &config)
}

fn carousel_transfer(oti: &Oti) -> TransferConfig {
    TransferConfig {
        oti: Some(oti.clone()),
        carousel_mode: Some(CarouselRepeatMode::DelayBetweenTransfers(
            Duration::from_secs(3600),
        )),
        ..Default::default()
    }
}

/// Encode one pass of ``content`` with the crate's FLUTE sender.
///
/// ``fec`` is ``"raptorq"`` (RFC 6330; ``repair_symbols_per_block`` repair symbols
/// after the source symbols of each block) or ``"none"`` (RFC 6726 Compact No-Code,
/// FEC Encoding ID 0, no repair). The object is in carousel mode, so no packet sets
/// Close-Object and replaying the pass keeps the TOI. The FDT (Instance
/// ``fdt_instance_id``) expires ``fdt_duration_s`` after now, carries the Sender
/// Current Time (unless ``sender_current_time`` is false), and names the object's Content-Location, type and (with
/// ``compute_md5``) Content-MD5. A carousel that runs on renews its FDT with
/// `encode_fdt` and `PacketBuffer.replace`.
#[pyfunction]
#[pyo3(signature = (content, *, content_location, content_type, tsi, toi, fec,
    encoding_symbol_length=1400, max_source_block_length=1024, repair_symbols_per_block=0,
    fdt_duration_s=86400, compute_md5=true, fdt_instance_id=1, sender_current_time=true))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_object(
    py: Python<'_>,
    content: Vec<u8>,
    content_location: &str,
    content_type: &str,
    tsi: u64,
    toi: u128,
    fec: &str,
    encoding_symbol_length: u16,
    max_source_block_length: u16,
    repair_symbols_per_block: u32,
    fdt_duration_s: u64,
    compute_md5: bool,
    fdt_instance_id: u32,
    sender_current_time: bool,
) -> PyResult<EncodedObject> {
    let (oti, location) = object_plan(
        toi,
        fec,
        encoding_symbol_length,
        max_source_block_length,
        repair_symbols_per_block,
        content_location,
    )?;
    let now = SystemTime::now();
    let mut sender = object_sender(
        tsi,
        toi,
        encoding_symbol_length,
        fdt_instance_id,
        fdt_duration_s,
        sender_current_time,
    );
    let object = ObjectDesc::create_from_buffer(
        content,
        content_type,
        &location,
        compute_md5,
        carousel_transfer(&oti),
    )
    .map_err(|e| flute_err("object", e))?;
    let transfer_length = object.transfer_length;
    let content_md5 = object.md5.clone();
    let toi = sender
        .add_object(0, object)
        .map_err(|e| flute_err("add object", e))?;
    sender
        .publish(now)
        .map_err(|e| flute_err("publish FDT", e))?;

    let mut fdt_packets = Vec::new();
    let mut packets = Vec::new();
    let mut sbns = Vec::new();
    let mut esis = Vec::new();
    let mut block_source_symbols: Vec<u32> = Vec::new();
    // with `now` fixed, the sender emits the FDT once and the object once, then None
    while let Some(pkt) = sender.read(now) {
        let alc = flute::core::alc::parse_alc_pkt(&pkt).map_err(|e| flute_err("own packet", e))?;
        if alc.lct.toi == 0 {
            fdt_packets.push(PyBytes::new(py, &pkt).unbind());
            continue;
        }
        let id = flute::core::alc::parse_payload_id(&alc, &oti)
            .map_err(|e| flute_err("own payload id", e))?;
        let sbn = id.sbn as usize;
        if block_source_symbols.len() <= sbn {
            block_source_symbols.resize(sbn + 1, 0);
        }
        // every block is its K source symbols then exactly the R repair symbols asked
        block_source_symbols[sbn] += 1;
        sbns.push(id.sbn);
        esis.push(id.esi);
        packets.push(PyBytes::new(py, &pkt).unbind());
    }
    for k in block_source_symbols.iter_mut() {
        *k = k.saturating_sub(repair_symbols_per_block);
    }
    if fdt_packets.is_empty() || (packets.is_empty() && transfer_length > 0) {
        return Err(PyValueError::new_err(format!(
            "the sender produced {} FDT and {} object packets for {transfer_length} bytes",
            fdt_packets.len(),
            packets.len()
        )));
    }
    Ok(EncodedObject {
        toi,
        tsi,
        fec: fec.to_owned(),
        transfer_length,
        encoding_symbol_length: oti.encoding_symbol_length,
        content_md5,
        fdt_instance_id: fdt_instance_id & 0xFFFFF,
        block_source_symbols,
        fdt_packets,
        packets,
        sbns,
        esis,
    })
}

/// Stands for an object's bytes where only its length is needed (the FDT).
#[derive(Debug)]
struct ZeroStream {
    len: u64,
    pos: u64,
}

impl std::io::Read for ZeroStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.len.saturating_sub(self.pos)).min(buf.len() as u64) as usize;
        buf[..n].fill(0);
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for ZeroStream {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            std::io::SeekFrom::Start(n) => n as i128,
            std::io::SeekFrom::End(n) => self.len as i128 + n as i128,
            std::io::SeekFrom::Current(n) => self.pos as i128 + n as i128,
        };
        if target < 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "before the start",
            ));
        }
        self.pos = target as u64;
        Ok(self.pos)
    }
}

/// The FDT packets of an object already encoded by `encode_object` (the same
/// arguments, its ``transfer_length`` and ``content_md5``), as FDT Instance
/// ``fdt_instance_id`` expiring ``fdt_duration_s`` after now, with the Sender Current
/// Time of now: a carousel that keeps running renews its FDT with these instead of
/// sending one that expires (RFC 6726 section 3.4.1: a new FDT Instance ID for the
/// new Expires). The object is not read.
#[pyfunction]
#[pyo3(signature = (*, content_location, content_type, transfer_length, content_md5, tsi,
    toi, fec, encoding_symbol_length=1400, max_source_block_length=1024,
    repair_symbols_per_block=0, fdt_instance_id=1, fdt_duration_s=86400))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_fdt(
    py: Python<'_>,
    content_location: &str,
    content_type: &str,
    transfer_length: u64,
    content_md5: Option<String>,
    tsi: u64,
    toi: u128,
    fec: &str,
    encoding_symbol_length: u16,
    max_source_block_length: u16,
    repair_symbols_per_block: u32,
    fdt_instance_id: u32,
    fdt_duration_s: u64,
) -> PyResult<Vec<Py<PyBytes>>> {
    let (oti, location) = object_plan(
        toi,
        fec,
        encoding_symbol_length,
        max_source_block_length,
        repair_symbols_per_block,
        content_location,
    )?;
    let now = SystemTime::now();
    let mut sender = object_sender(
        tsi,
        toi,
        encoding_symbol_length,
        fdt_instance_id,
        fdt_duration_s,
        true,
    );
    let object = Box::new(ObjectDesc {
        content_location: location,
        source: ObjectDataSource::from_stream(Box::new(ZeroStream {
            len: transfer_length,
            pos: 0,
        })),
        content_type: content_type.to_owned(),
        content_length: transfer_length,
        transfer_length,
        md5: content_md5,
        config: carousel_transfer(&oti),
    });
    sender
        .add_object(0, object)
        .map_err(|e| flute_err("add object", e))?;
    sender
        .publish(now)
        .map_err(|e| flute_err("publish FDT", e))?;
    let mut fdt_packets = Vec::new();
    // the FDT comes first; stop at the object's first packet
    while let Some(pkt) = sender.read(now) {
        let alc = flute::core::alc::parse_alc_pkt(&pkt).map_err(|e| flute_err("own packet", e))?;
        if alc.lct.toi != 0 {
            break;
        }
        fdt_packets.push(PyBytes::new(py, &pkt).unbind());
    }
    if fdt_packets.is_empty() {
        return Err(PyValueError::new_err("the sender produced no FDT packet"));
    }
    Ok(fdt_packets)
}
