//! The end of a connection: consumers detached, a clean session's bindings removed, the
//! will published (at once, or after its delay unless the session resumes first), and a
//! persistent session either ended (expiry 0) or stored with its disconnect time so its
//! expiry clock runs.

use std::sync::Arc;
use std::time::Duration;

use ferrymq_mqtt::Will;
use tokio::sync::oneshot;
use tracing::info;

use super::connection::Task;
use super::convert::will_message;
use super::{split_share, MqttContext};
use crate::access::authz::Request;
use crate::core::broker::{Commit, RetainMode};
use crate::core::message::{now_ms, SharedMessage};
use crate::core::router::{Destination, Routes};
use crate::core::store::{StoreWrite, NEVER};

impl Task {
    /// Ends the connection's part in its session once the socket is closed.
    pub(super) async fn cleanup(&mut self) {
        if self.session.is_some() {
            self.log_end();
        }
        let Some(session) = self.session.take() else {
            self.signals.finish();
            return;
        };
        self.ctx.broker.stats().disconnected();
        if self.info.take().is_some() {
            self.ctx.broker.unregister_connection(self.conn_id);
        }
        for q in self.consuming.as_mut().map(|c| std::mem::take(&mut c.attached)).unwrap_or_default() {
            self.ctx.broker.detach_consumer(q, self.conn_id);
        }
        // Fast-path deliveries still buffered for a clean session are gone with it.
        let client_id = session.client_id.clone();
        let persistent_ends = session.expiry_secs == 0;
        if let Some(link) = &session.link {
            let dest = Destination::Session(link.clone());
            for filter in session.subs.keys() {
                if split_share(filter).is_none() {
                    self.ctx.broker.unsubscribe(filter, &dest);
                }
            }
            // What the session spilled and has not received is gone with it too.
            if let Some(queue) = link.spill_queue() {
                self.ctx.broker.delete_queue(queue).await;
            }
        }
        let mut will = if self.publish_will { self.will.take().map(|w| *w) } else { None };
        if will.as_ref().is_some_and(|w| super::publish::is_reserved(&w.topic, &client_id)) {
            // As a PUBLISH there: `$SYS/...` and `$share/...` belong to the broker.
            conn_log!(info, self, "will not published: its topic is reserved for the broker");
            will = None;
        }
        if will.as_ref().is_some_and(|w| !self.permitted(Request::Publish(&w.topic))) {
            // A will is published only where its topic is writable (as Mosquitto).
            conn_log!(info, self, "will not published: its topic is not writable by this client");
            will = None;
        }
        let will_delay = will.as_ref().map_or(0, |w| will_delay(w.delay_interval, session.expiry_secs));
        let mut pending_will = None;
        if let Some(w) = will {
            if will_delay == 0 {
                publish_will(&self.ctx, &client_id, w).await;
            } else {
                let (cancel_tx, cancel_rx) = oneshot::channel();
                pending_will = Some(cancel_tx);
                let ctx = self.ctx.clone();
                let cid = client_id.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(will_delay as u64)) => publish_will(&ctx, &cid, w).await,
                        r = cancel_rx => if r.is_err() { publish_will(&ctx, &cid, w).await },
                    }
                });
            }
        }
        let still_ours;
        if persistent_ends || session.persistent.is_none() {
            if let Some(p) = &session.persistent {
                self.ctx.discard_persistent(&client_id, p).await;
                self.ctx.sessions.set_persistent(&client_id, None);
            } else {
                for filter in session.subs.keys() {
                    if let Some((group, f)) = split_share(filter) {
                        if let Some(q) = self.ctx.groups.leave(&self.ctx.broker, group, f, &client_id) {
                            self.ctx.broker.delete_queue(q).await;
                        }
                    }
                }
            }
            still_ours = self.ctx.sessions.release(&client_id, self.conn_id, None, pending_will);
        } else if let Some(mut p) = session.persistent {
            let now = now_ms();
            p.stored.subscriptions = session.subs.to_map();
            p.stored.expiry_secs = session.expiry_secs;
            p.stored.disconnected_at_ms = Some(now);
            let expires = (session.expiry_secs != NEVER).then(|| now + session.expiry_secs as u64 * 1000);
            self.ctx.sessions.set_persistent(&client_id, Some(p.clone()));
            let write = self.ctx.broker.stores().sessions.save(&client_id, &p.stored);
            if let Err(e) = self.ctx.broker.commit(write, Commit::Queued).await {
                conn_log!(warn, self, error = %e, "cannot store session at disconnect");
            }
            still_ours = self.ctx.sessions.release(&client_id, self.conn_id, expires, pending_will);
        } else {
            still_ours = false;
        }
        conn_log!(debug, self, still_ours, "connection cleaned up");
        self.signals.finish();
    }
}

/// Publishes a will message.
async fn publish_will(ctx: &MqttContext, client_id: &str, w: Will) {
    let now = now_ms();
    let msg: SharedMessage = Arc::new(will_message(&w, ctx.broker.routing().mqtt_exchange(), now));
    let routes: Routes = ctx.broker.routing().resolve(&msg, client_id);
    let retain = if w.retain { RetainMode::Persist } else { RetainMode::None };
    info!(client_id, topic = %w.topic, "publishing will message");
    if let Some(signal) = ctx.broker.publish(&msg, &routes, retain, StoreWrite::none()).await {
        let _ = signal.await;
    }
}

/// Seconds before a will is published: its delay interval, but no later than the end of
/// the session (MQTT-3.1.3-9: whichever happens first).
fn will_delay(delay_interval: Option<u32>, session_expiry_secs: u32) -> u32 {
    delay_interval.unwrap_or(0).min(session_expiry_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_will_waits_for_its_delay_or_the_session_end_whichever_is_first() {
        assert_eq!(will_delay(None, NEVER), 0);
        assert_eq!(will_delay(Some(30), NEVER), 30);
        assert_eq!(will_delay(Some(30), 10), 10);
        assert_eq!(will_delay(Some(30), 0), 0, "a session that ends with the connection");
    }
}
