//! How an object the crate's session reconstructs ends, as `ObjectEvent`s: the writer
//! the session stores objects through (`<dir>/<toi>.object`) queues an event when one
//! completes, fails or is interrupted.

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use flute::core::UDPEndpoint;
use flute::receiver::writer::{
    ObjectMetadata, ObjectWriter, ObjectWriterBuilder, ObjectWriterBuilderResult,
};
use pyo3::prelude::*;

/// What happened to an object a `Receiver` was reconstructing.
#[pyclass(frozen, skip_from_py_object, module = "pressrun_flute")]
#[derive(Clone)]
pub(crate) struct ObjectEvent {
    /// "completed", "error" or "interrupted"
    #[pyo3(get)]
    pub(crate) kind: String,
    #[pyo3(get)]
    pub(crate) toi: u128,
    #[pyo3(get)]
    pub(crate) content_location: String,
    /// where the object was written (a completed object only; otherwise removed)
    #[pyo3(get)]
    pub(crate) path: Option<PathBuf>,
    #[pyo3(get)]
    pub(crate) content_length: Option<usize>,
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

pub(crate) type EventQueue = Rc<RefCell<Vec<ObjectEvent>>>;

/// Writes each object to ``<dir>/<toi>.object`` and queues an event when it ends.
#[derive(Debug)]
pub(crate) struct EventWriterBuilder {
    pub(crate) dir: PathBuf,
    pub(crate) md5_check: bool,
    pub(crate) events: EventQueue,
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
