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
//!
//! The modules, one concern each: `encode` (a pass and its FDT, built by the crate's
//! sender), `send` (`PacketBuffer`, a pass sent without the GIL), `sequence` (the
//! channel sequence number, HET 250), `events` (`ObjectEvent` and the writer the
//! crate's session stores objects through), `receiver` (the `Receiver` class; its
//! receive loop in `receiver/receive_loop.rs`), `socket` (recvmmsg and poll on the
//! channel sockets, `drain_datagrams`), `counts` (what the loop counts per channel),
//! `fast` (the receive loop's own decoder); this file, the Python module's glue.

mod counts;
mod encode;
mod events;
mod fast;
mod receiver;
mod send;
mod sequence;
mod socket;

use flute::core::UDPEndpoint;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The endpoint every packet of a receiver is filed under: the sockets are the
/// adapter's business; one key makes every channel of a carousel one FLUTE session.
fn session_endpoint() -> UDPEndpoint {
    UDPEndpoint::new(None, "pressrun-carousel".to_owned(), 0)
}

fn flute_err(context: &str, err: flute::error::FluteError) -> PyErr {
    PyValueError::new_err(format!("{context}: {}", err.0))
}

/// The crate version this binding was built against.
const FLUTE_VERSION: &str = "1.11.7";

#[pymodule]
fn pressrun_flute(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FLUTE_CRATE_VERSION", FLUTE_VERSION)?;
    m.add_function(wrap_pyfunction!(encode::encode_object, m)?)?;
    m.add_function(wrap_pyfunction!(encode::encode_fdt, m)?)?;
    m.add_function(wrap_pyfunction!(sequence::add_channel_sequence, m)?)?;
    m.add_function(wrap_pyfunction!(sequence::channel_sequence, m)?)?;
    m.add_function(wrap_pyfunction!(socket::drain_datagrams, m)?)?;
    m.add_class::<encode::EncodedObject>()?;
    m.add_class::<events::ObjectEvent>()?;
    m.add_class::<receiver::Receiver>()?;
    m.add_class::<send::PacketBuffer>()?;
    Ok(())
}
