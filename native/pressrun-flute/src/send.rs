//! The Python class `PacketBuffer`: a carousel pass in Rust memory, sent with
//! `sendto` without the GIL, each packet numbered on the way out (HET 250) when asked.

use std::sync::RwLock;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::sequence::with_channel_sequence;

/// One carousel pass kept in Rust memory, sent without the GIL.
///
/// The send thread of ``pressrun serve multicast`` hands it the indices the pure
/// carousel schedule says are due; ``send`` loops over them with ``sendto`` on the
/// caller's (blocking) UDP socket, with the GIL released, so the Python loop costs
/// one call per batch instead of one per packet. ``replace`` swaps a packet (a
/// renewed FDT) while the pass is being sent.
#[pyclass(frozen, module = "pressrun_flute")]
pub(crate) struct PacketBuffer {
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
