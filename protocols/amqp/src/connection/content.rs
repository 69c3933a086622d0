//! Content assembly: Basic.Publish, then a content header (checked against
//! `max_message_size`), then body frames totalling the announced size, reported as one
//! [`Publish`] (with its confirm sequence number in confirm mode). The body is the body
//! frame's payload when it came in one frame, else the frames concatenated once.

use amq_protocol::protocol::basic;
use bytes::{Bytes, BytesMut};

use super::channels::{Channel, Mode};
use super::fault::Fault;
use super::{Connection, Event, Phase, Publish};
use crate::{decode, reply, BasicProperties};

/// Offending class/method ids of Basic.Publish, for content errors.
pub(super) const PUBLISH_IDS: (u16, u16) = (60, 40);

/// Body frames received so far; the body is concatenated once, when complete.
#[derive(Debug, Default)]
pub(super) struct Parts {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Parts {
    /// Adds a body frame's payload (empty payloads are dropped).
    pub(super) fn push(&mut self, payload: Bytes) {
        if payload.is_empty() {
            return;
        }
        if self.first.is_none() {
            self.first = Some(payload);
        } else {
            self.rest.push(payload);
        }
    }

    /// The whole body: the single payload as is, or all of them copied into one buffer.
    pub(super) fn into_body(self, size: usize) -> Bytes {
        let Some(first) = self.first else {
            return Bytes::new();
        };
        if self.rest.is_empty() {
            return first;
        }
        let mut body = BytesMut::with_capacity(size);
        body.extend_from_slice(&first);
        for part in &self.rest {
            body.extend_from_slice(part);
        }
        body.freeze()
    }
}

/// A publish waiting for its body frames.
#[derive(Debug)]
pub(super) struct Partial {
    /// The Basic.Publish method.
    pub publish: basic::Publish,
    /// Properties from the content header.
    pub properties: BasicProperties,
    /// Announced body size.
    pub size: u64,
    /// Bytes still expected.
    pub remaining: u64,
    /// Body frame payloads received so far.
    pub parts: Parts,
}

/// Content assembly state of a channel.
#[derive(Debug, Default)]
pub(super) enum Assembly {
    /// Expecting a method frame.
    #[default]
    Idle,
    /// Basic.Publish seen: expecting its content header.
    Header(basic::Publish),
    /// Header seen: expecting body frames.
    Body(Box<Partial>),
}

impl Connection {
    /// A content header frame on a running channel.
    pub(super) fn on_header(&mut self, channel: u16, payload: &[u8]) {
        let max_size = self.config.max_message_size;
        let Some(ch) = self.channels.get_mut(channel) else {
            return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
        };
        if ch.closing {
            return;
        }
        let publish = match std::mem::take(&mut ch.content) {
            Assembly::Header(p) => p,
            Assembly::Idle => {
                return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
            }
            Assembly::Body(_) => {
                return self
                    .fail(Fault::unexpected("expected content body, got non content body frame instead", PUBLISH_IDS));
            }
        };
        let Some(prefix) = decode::header_prefix(payload) else {
            return self.fail(Fault::malformed("cannot decode content header".into(), PUBLISH_IDS));
        };
        if prefix.class_id != 60 {
            return self.fail(Fault::unexpected(
                "expected content header for class 60, got one for another class instead",
                PUBLISH_IDS,
            ));
        }
        if prefix.body_size > max_size {
            let text = reply::text(
                reply::PRECONDITION_FAILED,
                &format!("message size {} is larger than configured max size {max_size}", prefix.body_size),
            );
            self.channel_error(channel, reply::PRECONDITION_FAILED, &text, PUBLISH_IDS.0, PUBLISH_IDS.1);
            return;
        }
        let Some(properties) = decode::decode_properties(payload) else {
            return self.fail(Fault::malformed("cannot decode content header".into(), PUBLISH_IDS));
        };
        let partial = Partial {
            publish,
            properties,
            size: prefix.body_size,
            remaining: prefix.body_size,
            parts: Default::default(),
        };
        if prefix.body_size == 0 {
            self.complete(channel, partial);
        } else if let Some(ch) = self.channels.get_mut(channel) {
            ch.content = Assembly::Body(Box::new(partial));
        }
    }

    /// A content body frame: appended to the channel's message; the last one completes it.
    pub(super) fn on_body(&mut self, channel: u16, payload: Bytes) {
        match self.phase {
            Phase::Closing | Phase::Closed => return,
            Phase::Running if channel != 0 => {}
            _ if channel == 0 => return self.fail(Fault::unexpected("content frame on channel 0", (0, 0))),
            _ => return self.fail(Fault::unexpected("frame on a channel before the connection is open", (0, 0))),
        }
        let Some(ch) = self.channels.get_mut(channel) else {
            return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
        };
        if ch.closing {
            return;
        }
        let partial = match &mut ch.content {
            Assembly::Body(p) => p,
            Assembly::Idle => {
                return self.fail(Fault::unexpected("expected method frame, got non method frame instead", (0, 0)));
            }
            Assembly::Header(_) => {
                return self.fail(Fault::unexpected(
                    "expected content header for class 60, got non content header frame instead",
                    PUBLISH_IDS,
                ));
            }
        };
        let len = payload.len() as u64;
        if len > partial.remaining {
            return self
                .fail(Fault::malformed("content body frame exceeds remaining content size".into(), PUBLISH_IDS));
        }
        partial.remaining -= len;
        partial.parts.push(payload);
        if partial.remaining == 0 {
            if let Assembly::Body(partial) = std::mem::take(&mut ch.content) {
                self.complete(channel, *partial);
            }
        }
    }

    /// Reports an assembled message.
    fn complete(&mut self, channel: u16, partial: Partial) {
        let confirm_tag = match self.channels.get_mut(channel) {
            Some(Channel { mode: Mode::Confirm { next }, .. }) => {
                let tag = *next;
                *next = next.saturating_add(1);
                Some(tag)
            }
            _ => None,
        };
        let size = usize::try_from(partial.size).unwrap_or(usize::MAX);
        self.events.push_back(Event::Publish(Box::new(Publish {
            channel,
            exchange: partial.publish.exchange,
            routing_key: partial.publish.routing_key,
            mandatory: partial.publish.mandatory,
            immediate: partial.publish.immediate,
            properties: partial.properties,
            body: partial.parts.into_body(size),
            confirm_tag,
        })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_concatenate_once() {
        let buf = Bytes::from_static(b"hello world");
        let mut p = Parts::default();
        p.push(buf.slice(0..11));
        let one = p.into_body(11);
        assert_eq!(one.as_ptr(), buf.as_ptr(), "a single part is not copied");
        let mut p = Parts::default();
        p.push(buf.slice(0..5));
        p.push(Bytes::new());
        p.push(buf.slice(5..11));
        assert_eq!(&p.into_body(11)[..], b"hello world");
        assert!(Parts::default().into_body(0).is_empty());
    }
}
