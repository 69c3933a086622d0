//! Inbound QoS 1/2 publishes awaiting the broker's answer or the client's PUBREL.

/// Where an inbound publish stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InState {
    /// QoS 1 reported, PUBACK not sent yet.
    Qos1,
    /// QoS 2 reported, PUBREC not sent yet.
    Qos2Pending,
    /// PUBREC sent, awaiting PUBREL.
    Qos2Answered,
}
