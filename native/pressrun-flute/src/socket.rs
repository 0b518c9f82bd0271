//! The receive loop's sockets: recvmmsg on a channel socket in batches (`Batch`), each
//! datagram with the kernel's arrival stamp and the socket's drop count, poll on the
//! sockets (`wait_readable`), and the bare loop the benchmark compares the receive
//! loop with (`drain_datagrams`), without the GIL.

use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// Linux's SO_TIMESTAMPNS (SCM_TIMESTAMPNS) and SO_RXQ_OVFL, as the Python side sets
/// them on the channel sockets (pressrun.multicast.net).
const SO_TIMESTAMPNS: i32 = 35;
const SO_RXQ_OVFL: i32 = 40;
/// Datagrams read by one recvmmsg call at most.
pub(crate) const BATCH: usize = 64;
/// Bytes read of each datagram (symbols of up to 4 kB with their headers).
const DATAGRAM_BYTES: usize = 4200;
/// Control bytes per datagram: a timespec and a u32, each in its cmsg header.
const CONTROL_BYTES: usize = 64;

/// The buffers of one recvmmsg batch, kept between calls.
pub(crate) struct Batch {
    data: Vec<u8>,
    control: Vec<u8>,
    iov: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iov` and `headers` point into `data` and `control`,
// which the same struct owns; they are set again before each use.
unsafe impl Send for Batch {}

impl Batch {
    pub(crate) fn new() -> Self {
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
    pub(crate) fn read(&mut self, fd: i32) -> std::io::Result<usize> {
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
    pub(crate) fn datagram(&self, i: usize) -> (&[u8], Option<f64>, Option<u32>) {
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

/// Wait until one of ``fds`` is readable or ``timeout`` passes (poll).
pub(crate) fn wait_readable(fds: &[i32], timeout: Duration) -> std::io::Result<Vec<bool>> {
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

/// A bare loop for comparison (bench/multicast.py): the same poll and recvmmsg on
/// ``fds`` for ``duration_s``, batching as `Receiver.receive` does, the datagrams
/// discarded; returns how many were read.
#[pyfunction]
#[pyo3(signature = (fds, duration_s, batch_wait_s=0.02))]
pub(crate) fn drain_datagrams(
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
