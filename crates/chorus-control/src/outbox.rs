//! The queues a node's parts write into and the runtime drains.

use std::collections::VecDeque;

use crate::event::Event;
use crate::transmit::{ConnectionIntent, Transmit};

#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) transmits: VecDeque<Transmit>,
    pub(crate) intents: VecDeque<ConnectionIntent>,
    pub(crate) events: VecDeque<Event>,
}
