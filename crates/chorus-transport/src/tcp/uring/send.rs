//! The ring's sends: what a connection has on the wire, written from a registered slot
//! (small frames, copied), from the frame's own buffers, or with `SEND_ZC` (payloads at or
//! above the zero-copy threshold, kept alive until the kernel's notification).

use std::io;
use std::os::fd::AsRawFd;

use io_uring::opcode;
use io_uring::types::Fd;

use super::thread::{Op, RingThread};
use crate::outbound::OutFrame;
use crate::tcp::teardown::{Event, Teardown};

/// The frame a connection has on the wire.
pub(super) struct Sending {
    pub(super) frame: OutFrame,
    /// The rest of the frame was copied into this registered slot when the frame's offset
    /// was the second field.
    pub(super) slot: Option<(u16, usize)>,
    /// The departure: once it is out, the teardown goes on to shut.
    pub(super) depart: bool,
}

impl RingThread {
    /// Starts the next send segment if none is in flight, taking the next queued frame
    /// when the current one is done. False if there was nothing to send.
    pub(super) fn pump_send(&mut self, id: u64) -> bool {
        let slot_size = self.slots.size;
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let zc_threshold = c.zc_threshold;
        if c.send.is_some() {
            return true;
        }
        if c.closing.as_ref().is_some_and(Teardown::is_shut) {
            return false;
        }
        if c.cur.is_none() {
            let next = c.outbound.lock().pop();
            let Some(frame) = next else {
                return false;
            };
            c.cur = Some(Sending {
                frame,
                slot: None,
                depart: false,
            });
        }
        let fd = c.fd.as_raw_fd();
        let Some(cur) = c.cur.as_mut() else {
            return false;
        };
        let left = cur.frame.len() - cur.frame.off;
        if cur.slot.is_none()
            && left <= slot_size
            && let Some(slot) = self.slots.take()
        {
            let (head, payload) = cur.frame.rest();
            let ptr = self.slots.ptr(slot);
            // SAFETY: `ptr` starts a slot of `slot_size >= left` bytes that no other
            // operation uses (it was just taken from the free list).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr, left) };
            dst[..head.len()].copy_from_slice(head);
            dst[head.len()..].copy_from_slice(payload);
            cur.slot = Some((slot, cur.frame.off));
        }
        let flags = libc::MSG_NOSIGNAL;
        let (entry, op) = if let Some((slot, base)) = cur.slot {
            let ptr = self.slots.ptr(slot).wrapping_add(cur.frame.off - base);
            let e = opcode::Send::new(Fd(fd), ptr, left as u32)
                .flags(flags)
                .build();
            (e, Op::Send { conn: id })
        } else {
            let (head, payload) = cur.frame.rest();
            if !head.is_empty() {
                let more = if payload.is_empty() {
                    0
                } else {
                    libc::MSG_MORE
                };
                let e = opcode::Send::new(Fd(fd), head.as_ptr(), head.len() as u32)
                    .flags(flags | more)
                    .build();
                (e, Op::Send { conn: id })
            } else {
                let keep = cur
                    .frame
                    .payload
                    .slice(cur.frame.payload.len() - payload.len()..);
                let len = keep.len().min(1 << 30) as u32;
                if cur.frame.payload.len() >= zc_threshold {
                    let e = opcode::SendZc::new(Fd(fd), keep.as_ptr(), len)
                        .flags(flags)
                        .build();
                    let op = Op::SendZc {
                        conn: id,
                        keep,
                        result_seen: false,
                        notifs: 0,
                    };
                    (e, op)
                } else {
                    let e = opcode::Send::new(Fd(fd), keep.as_ptr(), len)
                        .flags(flags)
                        .build();
                    (e, Op::Send { conn: id })
                }
            }
        };
        let ud = self.push(entry, op);
        if let Some(c) = self.conns.get_mut(&id) {
            c.send = Some(ud);
        }
        true
    }

    pub(super) fn on_sent(&mut self, id: u64, res: i32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.send = None;
        if c.closing.as_ref().is_some_and(Teardown::is_shut) {
            return;
        }
        if res < 0 {
            let detail = format!("send: {}", io::Error::from_raw_os_error(-res));
            c.reader.write_failed(detail);
            self.torn(id);
            return;
        }
        let Some(cur) = c.cur.as_mut() else { return };
        cur.frame.off += res as usize;
        if !cur.frame.is_done() {
            self.pump_send(id);
            return;
        }
        let Some(mut done) = c.cur.take() else { return };
        if let Some((slot, _)) = done.slot.take() {
            self.slots.give(slot);
        }
        let was_depart = done.depart;
        done.frame.release(&c.matcher);
        if was_depart {
            self.teardown(id, Event::Departed);
        } else if c.closing.is_some() {
            self.advance_close(id);
        } else {
            self.pump_send(id);
        }
    }
}
