//! pressrun's own small binding over the Rust crate `flute` (ypo/flute).
//!
//! It exposes only what pressrun's multicast carousel uses, which the PyPI bindings
//! (`flute-alc`) lack (see FIELD-NOTES.md, "FLUTE"):
//!
//! - `encode_object`: one pass of an object as ALC/LCT packets built by the crate's
//!   `Sender`, with RaptorQ (RFC 6330) or no-code FEC, the object in carousel mode so
//!   no packet carries Close-Object and a replayed pass keeps its TOI; each packet's
//!   (SBN, ESI) is read back with the crate's own ALC parser, so the carousel schedule
//!   can send different encoding symbols on different channels.
//! - `Receiver`: the crate's `MultiReceiver` with a settable object cache size, every
//!   channel of a carousel fed into one session (so symbols from several channels meet
//!   in one decoder), and completion reported as events (`ObjectEvent`), never through
//!   the log.

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::RwLock;
use std::time::{Duration, SystemTime};

use flute::core::{Oti, UDPEndpoint};
use flute::receiver::writer::{
    ObjectMetadata, ObjectWriter, ObjectWriterBuilder, ObjectWriterBuilderResult,
};
use flute::receiver::{Config as ReceiverConfig, MultiReceiver};
use flute::sender::{
    CarouselRepeatMode, Config as SenderConfig, ObjectDataSource, ObjectDesc, Sender,
    TransferConfig,
};
use pyo3::exceptions::{PyOSError, PyValueError};

mod fast;
use fast::{FastObjects, Taken};
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
const SEQUENCE_MODULO: u32 = 1 << 24;

/// ``packet`` with the channel sequence extension added after its other header
/// extensions (HDR_LEN one word more); None when it is not an LCT packet that can take
/// one (shorter than its header, or a header already 255 words long).
fn with_channel_sequence(packet: &[u8], sequence: u32, out: &mut Vec<u8>) -> bool {
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
fn sequence_of(packet: &[u8], lct: &flute::core::lct::LCTHeader) -> Option<u32> {
    match flute::core::lct::get_ext(packet, lct, HET_CHANNEL_SEQUENCE) {
        Ok(Some(ext)) if ext.len() >= 4 => Some(u32::from_be_bytes([0, ext[1], ext[2], ext[3]])),
        _ => None,
    }
}

/// ``packet`` with channel sequence number ``sequence`` (mod 2^24) in an LCT header
/// extension (HET 250) that standard receivers skip.
#[pyfunction]
fn add_channel_sequence<'py>(
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
fn channel_sequence(packet: &[u8]) -> Option<u32> {
    let alc = flute::core::alc::parse_alc_pkt(packet).ok()?;
    sequence_of(packet, &alc.lct)
}

/// What a receiver counted on one channel from the sequence numbers: ``received``
/// packets that carried one, and ``expected``, how far the highest number seen moved
/// on (a gap is packets lost before this socket's queue or in it).
#[derive(Debug, Default, Clone, Copy)]
struct SequenceTrack {
    highest: Option<u32>,
    received: u64,
    expected: u64,
}

/// Beyond this many numbers back, a sequence number means the sender restarted (its
/// counters begin again): the track starts over from it.
const SEQUENCE_RESTART_GAP: u32 = 4096;

impl SequenceTrack {
    fn see(&mut self, seq: u32) {
        self.received += 1;
        match self.highest {
            None => {
                self.highest = Some(seq);
                self.expected += 1;
            }
            Some(high) => {
                let ahead = seq.wrapping_sub(high) % SEQUENCE_MODULO;
                if ahead == 0 {
                    // a duplicate: counted received, expects nothing more
                } else if ahead < SEQUENCE_MODULO / 2 {
                    self.highest = Some(seq);
                    self.expected += ahead as u64;
                } else if SEQUENCE_MODULO - ahead > SEQUENCE_RESTART_GAP {
                    self.highest = Some(seq);
                    self.expected += 1;
                }
                // else: late (reordered), already expected
            }
        }
    }
}

/// The endpoint every packet of a receiver is filed under: the sockets are the
/// adapter's business; one key makes every channel of a carousel one FLUTE session.
fn session_endpoint() -> UDPEndpoint {
    UDPEndpoint::new(None, "pressrun-carousel".to_owned(), 0)
}

fn flute_err(context: &str, err: flute::error::FluteError) -> PyErr {
    PyValueError::new_err(format!("{context}: {}", err.0))
}

/// One pass of an object: the FDT packets and the object's packets, in the order the
/// crate's sender produced them, with each object packet's source block and ESI.
#[pyclass(frozen, module = "pressrun_flute")]
struct EncodedObject {
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
fn encode_object(
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
fn encode_fdt(
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

/// What happened to an object a `Receiver` was reconstructing.
#[pyclass(frozen, skip_from_py_object, module = "pressrun_flute")]
#[derive(Clone)]
struct ObjectEvent {
    /// "completed", "error" or "interrupted"
    #[pyo3(get)]
    kind: String,
    #[pyo3(get)]
    toi: u128,
    #[pyo3(get)]
    content_location: String,
    /// where the object was written (a completed object only; otherwise removed)
    #[pyo3(get)]
    path: Option<PathBuf>,
    #[pyo3(get)]
    content_length: Option<usize>,
}

#[pymethods]
impl ObjectEvent {
    fn __repr__(&self) -> String {
        format!(
            "ObjectEvent(kind={:?}, toi={}, content_location={:?}, path={:?})",
            self.kind, self.toi, self.content_location, self.path
        )
    }
}

type EventQueue = Rc<RefCell<Vec<ObjectEvent>>>;

/// Writes each object to ``<dir>/<toi>.object`` and queues an event when it ends.
#[derive(Debug)]
struct EventWriterBuilder {
    dir: PathBuf,
    md5_check: bool,
    events: EventQueue,
}

impl std::fmt::Debug for ObjectEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.__repr__())
    }
}

impl ObjectWriterBuilder for EventWriterBuilder {
    fn new_object_writer(
        &self,
        _endpoint: &UDPEndpoint,
        _tsi: &u64,
        toi: &u128,
        meta: &ObjectMetadata,
        _now: SystemTime,
    ) -> ObjectWriterBuilderResult {
        ObjectWriterBuilderResult::StoreObject(Box::new(EventWriter {
            path: self.dir.join(format!("{toi}.object")),
            toi: *toi,
            meta: meta.clone(),
            md5_check: self.md5_check,
            file: RefCell::new(None),
            events: self.events.clone(),
        }))
    }

    fn update_cache_control(
        &self,
        _endpoint: &UDPEndpoint,
        _tsi: &u64,
        _toi: &u128,
        _meta: &ObjectMetadata,
        _now: SystemTime,
    ) {
    }

    fn fdt_received(
        &self,
        _endpoint: &UDPEndpoint,
        _tsi: &u64,
        _fdt_xml: &str,
        _expires: SystemTime,
        _meta: &ObjectMetadata,
        _transfer_duration: Duration,
        _now: SystemTime,
        _ext_time: Option<SystemTime>,
    ) {
    }
}

#[derive(Debug)]
struct EventWriter {
    path: PathBuf,
    toi: u128,
    meta: ObjectMetadata,
    md5_check: bool,
    file: RefCell<Option<std::io::BufWriter<std::fs::File>>>,
    events: EventQueue,
}

impl EventWriter {
    fn push(&self, kind: &str, path: Option<PathBuf>) {
        self.events.borrow_mut().push(ObjectEvent {
            kind: kind.to_owned(),
            toi: self.toi,
            content_location: self.meta.content_location.clone(),
            path,
            content_length: self.meta.content_length,
        });
    }

    fn discard(&self) {
        if self.file.borrow_mut().take().is_some() {
            std::fs::remove_file(&self.path).ok();
        }
    }
}

impl ObjectWriter for EventWriter {
    fn open(&self, _now: SystemTime) -> flute::error::Result<()> {
        let file = std::fs::File::create(&self.path)?;
        *self.file.borrow_mut() = Some(std::io::BufWriter::new(file));
        Ok(())
    }

    fn write(&self, _sbn: u32, data: &[u8], _now: SystemTime) -> flute::error::Result<()> {
        // blocks arrive in SBN order (the crate's block writer keeps the order)
        if let Some(file) = self.file.borrow_mut().as_mut() {
            file.write_all(data)?;
        }
        Ok(())
    }

    fn complete(&self, _now: SystemTime) {
        let flushed = match self.file.borrow_mut().take() {
            Some(mut file) => file.flush().is_ok(),
            None => false,
        };
        if flushed {
            self.push("completed", Some(self.path.clone()));
        } else {
            std::fs::remove_file(&self.path).ok();
            self.push("error", None);
        }
    }

    fn error(&self, _now: SystemTime) {
        self.discard();
        self.push("error", None);
    }

    fn interrupted(&self, _now: SystemTime) {
        self.discard();
        self.push("interrupted", None);
    }

    fn enable_md5_check(&self) -> bool {
        self.md5_check
    }
}

// ---------------------------------------------------------------------------------
// The receive loop: recvmmsg on the channel sockets, without the GIL.

/// Linux's SO_TIMESTAMPNS (SCM_TIMESTAMPNS) and SO_RXQ_OVFL, as the Python side sets
/// them on the channel sockets (pressrun.multicast.net).
const SO_TIMESTAMPNS: i32 = 35;
const SO_RXQ_OVFL: i32 = 40;
/// Datagrams read by one recvmmsg call at most.
const BATCH: usize = 64;
/// Bytes read of each datagram (symbols of up to 4 kB with their headers).
const DATAGRAM_BYTES: usize = 4200;
/// Control bytes per datagram: a timespec and a u32, each in its cmsg header.
const CONTROL_BYTES: usize = 64;

/// The buffers of one recvmmsg batch, kept between calls.
struct Batch {
    data: Vec<u8>,
    control: Vec<u8>,
    iov: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iov` and `headers` point into `data` and `control`,
// which the same struct owns; they are set again before each use.
unsafe impl Send for Batch {}

impl Batch {
    fn new() -> Self {
        Self {
            data: vec![0u8; BATCH * DATAGRAM_BYTES],
            control: vec![0u8; BATCH * CONTROL_BYTES],
            // SAFETY: all-zero iovec and mmsghdr are valid (null pointers, zero lengths)
            iov: vec![unsafe { std::mem::zeroed() }; BATCH],
            headers: vec![unsafe { std::mem::zeroed() }; BATCH],
        }
    }

    /// Read up to BATCH datagrams from ``fd`` without blocking: how many (0 when
    /// none is waiting), or the error.
    fn read(&mut self, fd: i32) -> std::io::Result<usize> {
        for i in 0..BATCH {
            self.iov[i] = libc::iovec {
                iov_base: self.data[i * DATAGRAM_BYTES..].as_mut_ptr().cast(),
                iov_len: DATAGRAM_BYTES,
            };
            let hdr = &mut self.headers[i].msg_hdr;
            hdr.msg_name = std::ptr::null_mut();
            hdr.msg_namelen = 0;
            hdr.msg_iov = &mut self.iov[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = self.control[i * CONTROL_BYTES..].as_mut_ptr().cast();
            hdr.msg_controllen = CONTROL_BYTES as _;
            hdr.msg_flags = 0;
            self.headers[i].msg_len = 0;
        }
        // SAFETY: every header points into buffers of the lengths it states
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(err);
        }
        Ok(n as usize)
    }

    /// Datagram ``i`` of the last read: its bytes, its arrival (Unix seconds) and
    /// the socket's drop count, where the kernel gave them.
    fn datagram(&self, i: usize) -> (&[u8], Option<f64>, Option<u32>) {
        let len = (self.headers[i].msg_len as usize).min(DATAGRAM_BYTES);
        let data = &self.data[i * DATAGRAM_BYTES..i * DATAGRAM_BYTES + len];
        let hdr = &self.headers[i].msg_hdr;
        let (mut arrived, mut drops) = (None, None);
        // SAFETY: the kernel filled msg_control up to msg_controllen; the CMSG macros
        // stay within it
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
            while !cmsg.is_null() {
                let c = &*cmsg;
                if c.cmsg_level == libc::SOL_SOCKET {
                    let payload = libc::CMSG_DATA(cmsg);
                    if c.cmsg_type == SO_TIMESTAMPNS {
                        let ts: libc::timespec = std::ptr::read_unaligned(payload.cast());
                        arrived = Some(ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9);
                    } else if c.cmsg_type == SO_RXQ_OVFL {
                        drops = Some(std::ptr::read_unaligned(payload.cast::<u32>()));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
            }
        }
        (data, arrived, drops)
    }
}

/// The channel key of an AMT tunnel's socket in the receive loop.
const TUNNEL_CHANNEL: u32 = u32::MAX;
/// Relay messages kept for Python at most (a relay sends one query per request).
const MAX_TUNNEL_MESSAGES: usize = 64;

/// An AMT Multicast Data message (RFC 7450 section 5.1.6: version 0, type 6, a
/// reserved byte, then a whole IPv4 datagram): (group, UDP destination port, UDP
/// payload) of the UDP datagram it carries; None for any other message or a datagram
/// that is not whole IPv4/UDP.
fn unwrap_multicast_data(data: &[u8]) -> Option<(u32, u16, &[u8])> {
    if data.len() < 2 + 20 + 8 || data[0] != 6 {
        return None;
    }
    let ip = &data[2..];
    if ip[0] >> 4 != 4 || ip[9] != 17 {
        return None;
    }
    let ihl = ((ip[0] & 0x0F) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || total < ihl + 8 || total > ip.len() {
        return None;
    }
    let group = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let udp = &ip[ihl..total];
    let port = u16::from_be_bytes([udp[2], udp[3]]);
    let length = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if length < 8 || length > udp.len() {
        return None;
    }
    Some((group, port, &udp[8..length]))
}

/// A hasher for channel indices (small integers this process chose): the receive
/// loop looks its channel up in two maps per datagram, where std's SipHash, made
/// for keys from the network, costs more than the lookup needs.
#[derive(Default)]
struct ChannelHasher(u64);

impl std::hash::Hasher for ChannelHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by channel index.
type ChannelMap<T> =
    std::collections::HashMap<u32, T, std::hash::BuildHasherDefault<ChannelHasher>>;

/// One channel's counts in the receive loop.
#[derive(Debug, Default, Clone, Copy)]
struct ChannelCounts {
    /// datagrams read since the last report
    received: u64,
    /// the socket's SO_RXQ_OVFL count when last seen
    drops_seen: u32,
    /// its growth since the last report
    drops_new: u64,
}

/// Wait until one of ``fds`` is readable or ``timeout`` passes (poll).
fn wait_readable(fds: &[i32], timeout: Duration) -> std::io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `polls` is a valid array of its length
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(err);
    }
    Ok(polls.iter().map(|p| p.revents != 0).collect())
}

/// A raw pointer the GIL-free closure may carry: the `Receiver` is `unsendable`, so
/// it is only ever used on the thread that made it, which is the one running the
/// closure (releasing the GIL moves nothing to another thread).
struct OnThisThread<T>(*mut T);
// SAFETY: see above: the pointer is dereferenced only on the thread that owns it
unsafe impl<T> Send for OnThisThread<T> {}

/// What `Receiver.receive` read: (per channel (channel, datagrams, socket drops
/// new), object packets pushed, datagrams dropped by the loss emulation, whether a
/// wake descriptor is readable, whether the object ended (events waiting)).
type ReceiveReport = (Vec<(u32, u64, u64)>, u64, u64, bool, bool);

/// A bare loop for comparison (bench/multicast.py): the same poll and recvmmsg on
/// ``fds`` for ``duration_s``, batching as `Receiver.receive` does, the datagrams
/// discarded; returns how many were read.
#[pyfunction]
#[pyo3(signature = (fds, duration_s, batch_wait_s=0.02))]
fn drain_datagrams(
    py: Python<'_>,
    fds: Vec<i32>,
    duration_s: f64,
    batch_wait_s: f64,
) -> PyResult<u64> {
    if !(duration_s >= 0.0 && batch_wait_s >= 0.0) {
        return Err(PyValueError::new_err("durations must not be negative"));
    }
    py.detach(move || {
        let mut batch = Batch::new();
        let end = std::time::Instant::now() + Duration::from_secs_f64(duration_s);
        let mut total = 0u64;
        loop {
            let now = std::time::Instant::now();
            if now >= end {
                return Ok(total);
            }
            let ready = wait_readable(&fds, end - now)?;
            let mut read = false;
            for (&fd, _) in fds.iter().zip(ready).filter(|(_, r)| *r) {
                loop {
                    let n = batch.read(fd)?;
                    total += n as u64;
                    read |= n > 0;
                    if n < BATCH {
                        break;
                    }
                }
            }
            if read {
                let left = end.saturating_duration_since(std::time::Instant::now());
                std::thread::sleep(Duration::from_secs_f64(batch_wait_s).min(left));
            }
        }
    })
    .map_err(|e: std::io::Error| PyOSError::new_err(e.to_string()))
}

/// A FLUTE receiver for one carousel: push every packet of every channel joined, then
/// take the `ObjectEvent`s. Not thread-safe: use it from the thread that made it.
#[pyclass(unsendable, module = "pressrun_flute")]
struct Receiver {
    inner: MultiReceiver,
    events: EventQueue,
    endpoint: UDPEndpoint,
    packets: u64,
    rejected: u64,
    clock_offset: Duration,
    clock_ahead: bool,
    sequences: ChannelMap<SequenceTrack>,
    counts: ChannelMap<ChannelCounts>,
    batch: Option<Batch>,
    /// the receive loop's own decoder (objects it takes never reach `inner`)
    fast: FastObjects,
    /// (group, port) of a tunnelled datagram -> channel index
    tunnel_map: std::collections::HashMap<(u32, u16), u32>,
    tunnel_messages: Vec<Vec<u8>>,
    md5_check: bool,
    rng: u64,
    /// arrival (kernel stamp, Unix s) of the first datagram read, and of the one
    /// that ended the object
    first_arrival: Option<f64>,
    end_arrival: Option<f64>,
}

#[pymethods]
impl Receiver {
    /// ``directory``: where objects are written (``<toi>.object``);
    /// ``max_cache_bytes``: memory for undecoded blocks per object (the crate's
    /// ``object_max_cache_size``; past it an object fails); ``md5_check``: let the crate
    /// reject an object whose FDT Content-MD5 does not match (off in pressrun, which
    /// checks the signed manifest piece by piece instead); ``clock_offset_s``: this
    /// receiver's clock is that many seconds ahead of the host's (negative: behind),
    /// as on a host whose clock is wrong (tests and emulations of clock skew);
    /// ``record_decodes``: keep the ESIs each RaptorQ block decode was given (64 blocks,
    /// then no more) so that `redecode` can time the crate's decode again on them
    /// (bench/multicast.py).
    #[new]
    #[pyo3(signature = (directory, *, max_cache_bytes=256 * 1024 * 1024, object_timeout_s=None, md5_check=false, clock_offset_s=0.0, record_decodes=false))]
    fn new(
        directory: PathBuf,
        max_cache_bytes: usize,
        object_timeout_s: Option<f64>,
        md5_check: bool,
        clock_offset_s: f64,
        record_decodes: bool,
    ) -> PyResult<Self> {
        if !clock_offset_s.is_finite() {
            return Err(PyValueError::new_err(
                "clock_offset_s must be a finite number",
            ));
        }
        if !directory.is_dir() {
            return Err(PyOSError::new_err(format!(
                "{directory:?} is not a directory"
            )));
        }
        let events: EventQueue = Rc::new(RefCell::new(Vec::new()));
        let fast = FastObjects::new(directory.clone(), max_cache_bytes, record_decodes);
        let writer = Rc::new(EventWriterBuilder {
            dir: directory,
            md5_check,
            events: events.clone(),
        });
        let config = ReceiverConfig {
            object_max_cache_size: Some(max_cache_bytes),
            object_timeout: object_timeout_s.map(Duration::from_secs_f64),
            object_receive_once: true,
            ..Default::default()
        };
        Ok(Self {
            inner: MultiReceiver::new(writer, Some(config), false),
            events,
            endpoint: session_endpoint(),
            packets: 0,
            rejected: 0,
            clock_offset: Duration::from_secs_f64(clock_offset_s.abs()),
            clock_ahead: clock_offset_s >= 0.0,
            sequences: ChannelMap::default(),
            counts: ChannelMap::default(),
            batch: None,
            fast,
            tunnel_map: std::collections::HashMap::new(),
            tunnel_messages: Vec::new(),
            md5_check,
            rng: 0x9E37_79B9_7F4A_7C15,
            first_arrival: None,
            end_arrival: None,
        })
    }

    /// Feed one UDP payload; returns its TOI (0 for an FDT packet) or None when the
    /// packet is not ALC/LCT or the session rejects it (counted in ``rejected``).
    fn push(&mut self, packet: &[u8]) -> Option<u128> {
        self.packets += 1;
        let toi = match flute::core::alc::parse_alc_pkt(packet) {
            Ok(alc) => alc.lct.toi,
            Err(_) => {
                self.rejected += 1;
                return None;
            }
        };
        match self.inner.push(&self.endpoint, packet, self.now()) {
            Ok(()) => Some(toi),
            Err(_) => {
                self.rejected += 1;
                None
            }
        }
    }

    /// Feed one UDP payload received on channel ``channel``: as `push`, and its
    /// channel sequence number (if any) counted for that channel.
    fn push_channel(&mut self, channel: u32, packet: &[u8]) -> Option<u128> {
        if let Ok(alc) = flute::core::alc::parse_alc_pkt(packet) {
            if let Some(seq) = sequence_of(packet, &alc.lct) {
                self.sequences.entry(channel).or_default().see(seq);
            }
        }
        self.push(packet)
    }

    /// Per channel, (packets with a sequence number, packets the sequence numbers
    /// say were sent) since the last call; the counts start again from zero.
    fn take_sequence_counts(&mut self) -> Vec<(u32, u64, u64)> {
        let mut out: Vec<(u32, u64, u64)> = self
            .sequences
            .iter_mut()
            .map(|(&ch, track)| {
                let counts = (ch, track.received, track.expected);
                track.received = 0;
                track.expected = 0;
                counts
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Forget channel ``channel``'s sequence numbers (it was left: a later join
    /// starts from the first packet then, the numbers sent meanwhile are not lost).
    fn forget_channel(&mut self, channel: u32) {
        self.sequences.remove(&channel);
        self.counts.remove(&channel);
    }

    /// The receive loop, without the GIL: wait for datagrams on ``channels`` (pairs
    /// of channel index and the socket's descriptor, which stays the caller's), read
    /// them in batches with recvmmsg, count each channel's datagrams, sequence
    /// numbers and socket drops (SO_RXQ_OVFL), and push every one into the session.
    /// After each round that read something it waits ``batch_wait_s`` so the next
    /// round reads that time's datagrams in one go. Returns when the object ends
    /// (its event is waiting: `take_events`), when one of ``wake_fds`` is readable
    /// (the control socket: not read here), or after ``timeout_s``; a
    /// `ReceiveReport`. ``drop_probability`` drops that share of the datagrams at
    /// random (loss emulation for tests and benchmarks; ``seed`` sets the draw).
    /// ``tunnel_fd``: an AMT gateway's UDP socket to its relay (RFC 7450): each
    /// Multicast Data message is unwrapped (IPv4 and UDP headers) and counted on the
    /// channel `set_tunnel_channels` maps its (group, port) to; any other message
    /// (the relay's Membership Query), and Multicast Data of a (group, port) not
    /// mapped (the control channel), is kept for `take_tunnel_messages` (at most 64)
    /// and ends the call as a wake descriptor does.
    #[pyo3(signature = (channels, timeout_s, *, wake_fds=Vec::new(), batch_wait_s=0.02,
        drop_probability=0.0, seed=None, tunnel_fd=None))]
    #[allow(clippy::too_many_arguments)]
    fn receive(
        &mut self,
        py: Python<'_>,
        channels: Vec<(u32, i32)>,
        timeout_s: f64,
        wake_fds: Vec<i32>,
        batch_wait_s: f64,
        drop_probability: f64,
        seed: Option<u64>,
        tunnel_fd: Option<i32>,
    ) -> PyResult<ReceiveReport> {
        if !(timeout_s >= 0.0 && batch_wait_s >= 0.0) {
            return Err(PyValueError::new_err("durations must not be negative"));
        }
        if !(0.0..1.0).contains(&drop_probability) {
            return Err(PyValueError::new_err("drop_probability must be in [0, 1)"));
        }
        if let Some(seed) = seed {
            self.rng = seed | 1;
        }
        let this = OnThisThread(self as *mut Self);
        py.detach(move || {
            let this = this;
            // SAFETY: OnThisThread: this thread owns the receiver, and Python cannot
            // touch it while the call runs (it holds the only &mut)
            let me = unsafe { &mut *this.0 };
            me.receive_loop(
                &channels,
                timeout_s,
                &wake_fds,
                batch_wait_s,
                drop_probability,
                tunnel_fd,
            )
        })
        .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Arrival (the kernel's stamp, Unix seconds) of the first datagram `receive`
    /// read, or None.
    #[getter]
    fn first_arrival(&self) -> Option<f64> {
        self.first_arrival
    }

    /// Arrival of the datagram after which the object ended, or None.
    #[getter]
    fn end_arrival(&self) -> Option<f64> {
        self.end_arrival
    }

    /// The events since the last call, oldest first.
    fn take_events(&mut self) -> Vec<ObjectEvent> {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// Drop expired objects and sessions (call now and then).
    fn cleanup(&mut self) {
        let now = self.now();
        self.inner.cleanup(now);
    }

    #[getter]
    fn packets(&self) -> u64 {
        self.packets
    }

    #[getter]
    fn rejected(&self) -> u64 {
        self.rejected
    }

    /// The channels an AMT tunnel carries: (group, port, channel index) each; a
    /// tunnelled datagram of another (group, port) (the control channel) is kept
    /// whole for `take_tunnel_messages` like the relay's own messages.
    fn set_tunnel_channels(&mut self, channels: Vec<(String, u16, u32)>) -> PyResult<()> {
        let mut map = std::collections::HashMap::new();
        for (group, port, index) in channels {
            let ip: std::net::Ipv4Addr = group
                .parse()
                .map_err(|e| PyValueError::new_err(format!("{group:?} is not IPv4: {e}")))?;
            map.insert((u32::from(ip), port), index);
        }
        self.tunnel_map = map;
        Ok(())
    }

    /// The relay's messages the receive loop read on the tunnel (not Multicast
    /// Data), oldest first.
    fn take_tunnel_messages<'py>(&mut self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        std::mem::take(&mut self.tunnel_messages)
            .iter()
            .map(|m| PyBytes::new(py, m))
            .collect()
    }

    /// Blocks the receive loop's own decoder tried to decode and could not yet
    /// (RaptorQ: rank-deficient, one more symbol then), over the objects it followed.
    #[getter]
    fn decode_retries(&self) -> u64 {
        self.fast.failed_decodes()
    }

    /// RaptorQ block decodes the receive loop's own decoder attempted (blocks that
    /// lacked source symbols when enough symbols came), over the objects it followed;
    /// 0 for a receiver that got every source symbol.
    #[getter]
    fn decodes(&self) -> u64 {
        self.fast.decode_cost().0
    }

    /// The receive thread's CPU seconds those decodes took (CLOCK_THREAD_CPUTIME_ID
    /// around each): the decode's share of the receive path's CPU.
    #[getter]
    fn decode_cpu_s(&self) -> f64 {
        self.fast.decode_cost().1
    }

    /// Of `decode_cpu_s`, the `raptorq` crate's `SourceBlockDecoder::decode` calls
    /// alone (the symbols already copied out for it): the crate's share of the
    /// receive path's CPU, the rest of the decode share (copies, the decoder's set-up)
    /// the binding's.
    #[getter]
    fn crate_decode_cpu_s(&self) -> f64 {
        self.fast.crate_decode_cpu_s()
    }

    /// With ``record_decodes``: the `raptorq` crate's decode timed again, without the
    /// GIL, on every recorded block of a completed object, given the same ESIs (the
    /// symbols made from the object's file by the crate's encoder beforehand, so warm
    /// in cache): (blocks, thread CPU seconds of the decodes alone, whether each
    /// decoded to the file's bytes). The crate's own cost on the data this receiver
    /// decoded, for the bench to set beside the receive path's.
    fn redecode(&self, py: Python<'_>) -> PyResult<(u64, f64, bool)> {
        let fast = &self.fast;
        let this = OnThisThread(fast as *const FastObjects as *mut FastObjects);
        py.detach(move || {
            let this = this;
            // SAFETY: OnThisThread: this thread owns the receiver; only read here
            let fast = unsafe { &*this.0 };
            fast.redecode()
        })
        .map(|r| (r.blocks, r.cpu_s, r.bit_exact))
        .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// The receive thread's CPU seconds spent writing completed blocks to the
    /// objects' files (each block is written at its offset once it is complete).
    #[getter]
    fn write_cpu_s(&self) -> f64 {
        self.fast.write_cost()
    }

    /// The receive thread's CPU seconds spent bringing in the objects' buffers (fresh
    /// memory, populated 256 kB at a time as the symbols first reach it): what a
    /// receiver pays for memory beyond the loop's own work (docs/multicast.md,
    /// "Receiver CPU"); 0 where the kernel cannot populate (before Linux 5.14: the
    /// pages are faulted in by the writes instead, uncounted).
    #[getter]
    fn memory_cpu_s(&self) -> f64 {
        self.fast.memory_cost()
    }

    /// The bytes of object ``toi`` this receiver holds already (pieces it took from
    /// the swarm and checked): ``ranges`` of (start, length) in the file ``path``, at
    /// the same offsets as in the object. When the object's first packet comes, the
    /// receive loop's decoder takes every source symbol wholly inside them as if it
    /// had arrived, so each block needs only the source symbols it lacks from the
    /// network (RaptorQ or no-code objects with EXT_FTI, the carousel's; a file that
    /// cannot be read gives nothing). `known_symbols` counts them.
    fn set_known(&mut self, toi: u128, path: PathBuf, ranges: Vec<(u64, u64)>) {
        self.fast.set_known(toi, path, ranges);
    }

    /// Source symbols taken from the bytes `set_known` named instead of the network.
    #[getter]
    fn known_symbols(&self) -> u64 {
        self.fast.known_symbols
    }
}

impl Receiver {
    fn next_random(&mut self) -> f64 {
        // xorshift64*: the loss emulation needs speed, not quality
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn receive_loop(
        &mut self,
        channels: &[(u32, i32)],
        timeout_s: f64,
        wake_fds: &[i32],
        batch_wait_s: f64,
        drop_probability: f64,
        tunnel_fd: Option<i32>,
    ) -> std::io::Result<ReceiveReport> {
        let end = std::time::Instant::now() + Duration::from_secs_f64(timeout_s);
        let mut batch = self.batch.take().unwrap_or_else(Batch::new);
        // an AMT tunnel's socket reads as one more channel (TUNNEL_CHANNEL): its
        // Multicast Data is unwrapped to the channel of the inner (group, port)
        let mut all: Vec<(u32, i32)> = channels.to_vec();
        if let Some(fd) = tunnel_fd {
            all.push((TUNNEL_CHANNEL, fd));
        }
        let channels_in = channels;
        let channels = &all[..];
        let mut fds: Vec<i32> = channels.iter().map(|&(_, fd)| fd).collect();
        fds.extend_from_slice(wake_fds);
        let (mut object_packets, mut emulated) = (0u64, 0u64);
        let mut woken = false;
        let mut ended = !self.events.borrow().is_empty();
        let result = (|| -> std::io::Result<()> {
            while !ended && !woken {
                let now = std::time::Instant::now();
                if now >= end {
                    break;
                }
                let ready = wait_readable(&fds, end - now)?;
                woken = ready[channels.len()..].iter().any(|&r| r);
                // one clock reading per round: the session uses it for expiries only
                let clock = self.now();
                let mut read = false;
                for (&(socket_channel, fd), _) in channels.iter().zip(&ready).filter(|(_, r)| **r) {
                    'socket: loop {
                        let n = batch.read(fd)?;
                        read |= n > 0;
                        for i in 0..n {
                            let (mut data, arrived, drops) = batch.datagram(i);
                            // the socket's drop count, kept per socket: the tunnel's
                            // (TUNNEL_CHANNEL) is one count for all the channels it
                            // carries, reported on the base channel below
                            if let Some(drops) = drops {
                                let counts = self.counts.entry(socket_channel).or_default();
                                counts.drops_new += drops.wrapping_sub(counts.drops_seen) as u64;
                                counts.drops_seen = drops;
                            }
                            let mut channel = socket_channel;
                            if socket_channel == TUNNEL_CHANNEL {
                                match unwrap_multicast_data(data) {
                                    Some((group, port, inner)) => {
                                        match self.tunnel_map.get(&(group, port)) {
                                            Some(&mapped) => {
                                                channel = mapped;
                                                data = inner;
                                            }
                                            None => {
                                                // another group (the control channel
                                                // through the tunnel): Python's, whole
                                                if self.tunnel_messages.len() < MAX_TUNNEL_MESSAGES
                                                {
                                                    self.tunnel_messages.push(data.to_vec());
                                                } else {
                                                    self.rejected += 1;
                                                }
                                                woken = true;
                                                continue;
                                            }
                                        }
                                    }
                                    None => {
                                        // a relay's message (a Membership Query): Python's
                                        if self.tunnel_messages.len() < MAX_TUNNEL_MESSAGES {
                                            self.tunnel_messages.push(data.to_vec());
                                        }
                                        woken = true;
                                        continue;
                                    }
                                }
                            }
                            if self.first_arrival.is_none() {
                                self.first_arrival = arrived;
                            }
                            if drop_probability > 0.0 && self.next_random() < drop_probability {
                                emulated += 1;
                                continue;
                            }
                            // looked up again: next_random borrowed self meanwhile
                            self.counts.entry(channel).or_default().received += 1;
                            // one parse for the sequence number and the TOI (the
                            // session parses again: its API takes bytes)
                            self.packets += 1;
                            match flute::core::alc::parse_alc_pkt(data) {
                                Ok(alc) => {
                                    if let Some(seq) = sequence_of(data, &alc.lct) {
                                        self.sequences.entry(channel).or_default().see(seq);
                                    }
                                    let toi = alc.lct.toi;
                                    // object packets to the binding's own decoder (fast.rs);
                                    // the FDT and objects it does not take to the session
                                    let taken = if toi != 0 && !self.md5_check {
                                        self.fast.push(&alc, data)
                                    } else {
                                        Taken::NotMine
                                    };
                                    match taken {
                                        Taken::Kept => object_packets += 1,
                                        Taken::Refused => self.rejected += 1,
                                        Taken::WriteFailed => {
                                            self.events.borrow_mut().push(ObjectEvent {
                                                kind: "error".to_owned(),
                                                toi,
                                                content_location: String::new(),
                                                path: None,
                                                content_length: None,
                                            });
                                        }
                                        Taken::Completed(path, length) => {
                                            object_packets += 1;
                                            self.events.borrow_mut().push(ObjectEvent {
                                                kind: "completed".to_owned(),
                                                toi,
                                                content_location: String::new(),
                                                path: Some(path),
                                                content_length: Some(length),
                                            });
                                        }
                                        Taken::NotMine | Taken::Failed => {
                                            match self.inner.push(&self.endpoint, data, clock) {
                                                Ok(()) if toi != 0 => object_packets += 1,
                                                Ok(()) => {}
                                                Err(_) => self.rejected += 1,
                                            }
                                        }
                                    }
                                }
                                Err(_) => self.rejected += 1,
                            }
                            if !self.events.borrow().is_empty() {
                                // stop at the datagram that ended the object
                                self.end_arrival = arrived;
                                ended = true;
                                break 'socket;
                            }
                        }
                        // a socket that never drains (a thread reading slower than its
                        // channels arrive: a host short of CPU) still gives the call
                        // back by its timeout: before, full batches kept it here until
                        // the object ended, and the layering (Python) got no turn
                        // (flash-crowd-50 at 49b8d26: a dsl-20 reader on 6 channels of a
                        // link that carries 4 ended no window for its last 15 s)
                        if n < BATCH || std::time::Instant::now() >= end {
                            break;
                        }
                    }
                    if ended {
                        break;
                    }
                }
                if read && !ended && !woken {
                    let left = end.saturating_duration_since(std::time::Instant::now());
                    std::thread::sleep(Duration::from_secs_f64(batch_wait_s).min(left));
                }
            }
            Ok(())
        })();
        self.batch = Some(batch);
        result?;
        let mut reported: Vec<u32> = channels_in.iter().map(|&(channel, _)| channel).collect();
        if tunnel_fd.is_some() {
            reported.extend(self.tunnel_map.values().copied());
            reported.sort_unstable();
            reported.dedup();
        }
        // the tunnel socket's drops (SO_RXQ_OVFL on the gateway's socket: a reader
        // starved of CPU overflows it as it would its channel sockets) count as the
        // base (lowest) channel's own drops: which channel's datagrams they were the
        // kernel does not say, and the base channel is always joined
        let mut tunnel_drops = 0u64;
        if tunnel_fd.is_some() && !reported.is_empty() {
            if let Some(counts) = self.counts.get_mut(&TUNNEL_CHANNEL) {
                tunnel_drops = std::mem::take(&mut counts.drops_new);
            }
        }
        let mut per_channel: Vec<(u32, u64, u64)> = reported
            .iter()
            .map(|&channel| {
                let counts = self.counts.entry(channel).or_default();
                let report = (channel, counts.received, counts.drops_new);
                counts.received = 0;
                counts.drops_new = 0;
                report
            })
            .collect();
        per_channel.sort_unstable();
        if let Some(base) = per_channel.first_mut() {
            base.2 += tunnel_drops;
        }
        Ok((per_channel, object_packets, emulated, woken, ended))
    }

    /// The receiver's clock: the host's, moved by ``clock_offset_s``.
    fn now(&self) -> SystemTime {
        if self.clock_ahead {
            SystemTime::now() + self.clock_offset
        } else {
            SystemTime::now() - self.clock_offset
        }
    }
}

/// One carousel pass kept in Rust memory, sent without the GIL.
///
/// The send thread of ``pressrun serve multicast`` hands it the indices the pure
/// carousel schedule says are due; ``send`` loops over them with ``sendto`` on the
/// caller's (blocking) UDP socket, with the GIL released, so the Python loop costs
/// one call per batch instead of one per packet. ``replace`` swaps a packet (a
/// renewed FDT) while the pass is being sent.
#[pyclass(frozen, module = "pressrun_flute")]
struct PacketBuffer {
    packets: RwLock<Vec<Vec<u8>>>,
}

impl PacketBuffer {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Vec<u8>>> {
        // a panic while holding the lock cannot leave a packet half written: go on
        self.packets.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PacketBuffer {
    #[new]
    fn new(packets: Vec<Vec<u8>>) -> Self {
        Self {
            packets: RwLock::new(packets),
        }
    }

    fn __len__(&self) -> usize {
        self.read().len()
    }

    /// The bytes of packet ``index`` (a copy).
    fn packet<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyBytes>> {
        let packets = self.read();
        let data = packets
            .get(index)
            .ok_or_else(|| PyValueError::new_err(format!("no packet {index}")))?;
        Ok(PyBytes::new(py, data))
    }

    /// Put ``packet`` in place of packet ``index`` (the send thread sends the new
    /// bytes from its next batch on).
    fn replace(&self, index: usize, packet: Vec<u8>) -> PyResult<()> {
        let mut packets = self.packets.write().unwrap_or_else(|e| e.into_inner());
        let slot = packets
            .get_mut(index)
            .ok_or_else(|| PyValueError::new_err(format!("no packet {index}")))?;
        *slot = packet;
        Ok(())
    }

    /// Send packets ``indices`` to ``host:port`` on the UDP socket ``fd`` (which
    /// stays the caller's); returns (packets sent, bytes sent, failures, the first
    /// failure's message or None). With ``sequence_start``, the k-th packet goes out
    /// with channel sequence number ``sequence_start + k`` (HET 250, mod 2^24).
    #[pyo3(signature = (fd, indices, host, port, sequence_start=None))]
    fn send(
        &self,
        py: Python<'_>,
        fd: i32,
        indices: Vec<u32>,
        host: &str,
        port: u16,
        sequence_start: Option<u32>,
    ) -> PyResult<(usize, usize, usize, Option<String>)> {
        use std::os::fd::FromRawFd;
        let ip: std::net::Ipv4Addr = host
            .parse()
            .map_err(|e| PyValueError::new_err(format!("{host:?} is not an IPv4 address: {e}")))?;
        let address = std::net::SocketAddrV4::new(ip, port);
        let length = self.__len__();
        if let Some(&bad) = indices.iter().find(|&&i| i as usize >= length) {
            return Err(PyValueError::new_err(format!(
                "packet {bad} out of range (the pass has {length})"
            )));
        }
        Ok(py.detach(move || {
            // the length never changes (`replace` swaps, never adds or removes)
            let packets = self.read();
            // SAFETY: the descriptor is the caller's open socket; ManuallyDrop keeps
            // this wrapper from closing it
            let socket =
                std::mem::ManuallyDrop::new(unsafe { std::net::UdpSocket::from_raw_fd(fd) });
            let (mut sent, mut bytes, mut failures) = (0usize, 0usize, 0usize);
            let mut first_error = None;
            let mut numbered = Vec::with_capacity(2048);
            for (k, &i) in indices.iter().enumerate() {
                let mut data: &[u8] = &packets[i as usize];
                if let Some(start) = sequence_start {
                    let seq = start.wrapping_add(k as u32);
                    if with_channel_sequence(data, seq, &mut numbered) {
                        data = &numbered;
                    }
                }
                match socket.send_to(data, address) {
                    Ok(n) => {
                        sent += 1;
                        bytes += n;
                    }
                    Err(err) => {
                        failures += 1;
                        first_error.get_or_insert_with(|| err.to_string());
                    }
                }
            }
            (sent, bytes, failures, first_error)
        }))
    }
}

/// The crate version this binding was built against.
const FLUTE_VERSION: &str = "1.11.7";

#[pymodule]
fn pressrun_flute(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FLUTE_CRATE_VERSION", FLUTE_VERSION)?;
    m.add_function(wrap_pyfunction!(encode_object, m)?)?;
    m.add_function(wrap_pyfunction!(encode_fdt, m)?)?;
    m.add_function(wrap_pyfunction!(add_channel_sequence, m)?)?;
    m.add_function(wrap_pyfunction!(channel_sequence, m)?)?;
    m.add_function(wrap_pyfunction!(drain_datagrams, m)?)?;
    m.add_class::<EncodedObject>()?;
    m.add_class::<ObjectEvent>()?;
    m.add_class::<Receiver>()?;
    m.add_class::<PacketBuffer>()?;
    Ok(())
}
