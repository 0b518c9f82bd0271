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
use pyo3::prelude::*;
use pyo3::types::PyBytes;

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
fn object_oti(
    fec: &str,
    encoding_symbol_length: u16,
    max_source_block_length: u16,
    repair_symbols_per_block: u16,
) -> PyResult<Oti> {
    match fec {
        "raptorq" => Oti::new_raptorq(
            encoding_symbol_length,
            max_source_block_length,
            repair_symbols_per_block,
            1,
            4,
        )
        .map_err(|e| flute_err("RaptorQ parameters", e)),
        "none" => {
            if repair_symbols_per_block != 0 {
                return Err(PyValueError::new_err(
                    "fec 'none' has no repair symbols: repair_symbols_per_block must be 0",
                ));
            }
            Ok(Oti::new_no_code(encoding_symbol_length, max_source_block_length))
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
        carousel_mode: Some(CarouselRepeatMode::DelayBetweenTransfers(Duration::from_secs(3600))),
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
    repair_symbols_per_block: u16,
    fdt_duration_s: u64,
    compute_md5: bool,
    fdt_instance_id: u32,
    sender_current_time: bool,
) -> PyResult<EncodedObject> {
    if toi == 0 {
        return Err(PyValueError::new_err("TOI 0 is the FDT's; give the object a TOI above 0"));
    }
    let oti = object_oti(fec, encoding_symbol_length, max_source_block_length, repair_symbols_per_block)?;
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
    let toi = sender.add_object(0, object).map_err(|e| flute_err("add object", e))?;
    sender.publish(now).map_err(|e| flute_err("publish FDT", e))?;

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
        *k = k.saturating_sub(repair_symbols_per_block as u32);
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
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "before the start"));
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
    repair_symbols_per_block: u16,
    fdt_instance_id: u32,
    fdt_duration_s: u64,
) -> PyResult<Vec<Py<PyBytes>>> {
    if toi == 0 {
        return Err(PyValueError::new_err("TOI 0 is the FDT's; give the object a TOI above 0"));
    }
    let oti = object_oti(fec, encoding_symbol_length, max_source_block_length, repair_symbols_per_block)?;
    let location = url::Url::parse(content_location).map_err(|e| {
        PyValueError::new_err(format!("content_location {content_location:?}: {e}"))
    })?;
    let now = SystemTime::now();
    let mut sender =
        object_sender(tsi, toi, encoding_symbol_length, fdt_instance_id, fdt_duration_s, true);
    let object = Box::new(ObjectDesc {
        content_location: location,
        source: ObjectDataSource::from_stream(Box::new(ZeroStream { len: transfer_length, pos: 0 })),
        content_type: content_type.to_owned(),
        content_length: transfer_length,
        transfer_length,
        md5: content_md5,
        config: carousel_transfer(&oti),
    });
    sender.add_object(0, object).map_err(|e| flute_err("add object", e))?;
    sender.publish(now).map_err(|e| flute_err("publish FDT", e))?;
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
}

#[pymethods]
impl Receiver {
    /// ``directory``: where objects are written (``<toi>.object``);
    /// ``max_cache_bytes``: memory for undecoded blocks per object (the crate's
    /// ``object_max_cache_size``; past it an object fails); ``md5_check``: let the crate
    /// reject an object whose FDT Content-MD5 does not match (off in pressrun, which
    /// checks the signed manifest piece by piece instead); ``clock_offset_s``: this
    /// receiver's clock is that many seconds ahead of the host's (negative: behind),
    /// as on a host whose clock is wrong (tests and emulations of clock skew).
    #[new]
    #[pyo3(signature = (directory, *, max_cache_bytes=256 * 1024 * 1024, object_timeout_s=None, md5_check=false, clock_offset_s=0.0))]
    fn new(
        directory: PathBuf,
        max_cache_bytes: usize,
        object_timeout_s: Option<f64>,
        md5_check: bool,
        clock_offset_s: f64,
    ) -> PyResult<Self> {
        if !clock_offset_s.is_finite() {
            return Err(PyValueError::new_err("clock_offset_s must be a finite number"));
        }
        if !directory.is_dir() {
            return Err(PyOSError::new_err(format!("{directory:?} is not a directory")));
        }
        let events: EventQueue = Rc::new(RefCell::new(Vec::new()));
        let writer = Rc::new(EventWriterBuilder { dir: directory, md5_check, events: events.clone() });
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
}

impl Receiver {
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
        Self { packets: RwLock::new(packets) }
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
    /// failure's message or None).
    fn send(
        &self,
        py: Python<'_>,
        fd: i32,
        indices: Vec<u32>,
        host: &str,
        port: u16,
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
            for &i in &indices {
                let data = &packets[i as usize];
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
    m.add_class::<EncodedObject>()?;
    m.add_class::<ObjectEvent>()?;
    m.add_class::<Receiver>()?;
    m.add_class::<PacketBuffer>()?;
    Ok(())
}
