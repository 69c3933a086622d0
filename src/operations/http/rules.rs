//! The topic side of authorization: RabbitMQ's `/api/topic-permissions` (routing-key
//! expressions per user, vhost and exchange) and FerryMQ's `/api/mqtt/rules` (the MQTT
//! topic rules, first match wins, replacing `[[auth.rules]]` once set). Both are stored,
//! and apply to open connections at their next request.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::access::put_topic_permission;
use super::error::ApiError;
use super::json::Body;
use super::permit::{Administrator, Permitted, Vhost};
use super::HttpContext;
use crate::access::authz::{rules_of, RuleEntry};
use crate::core::broker::Commit;
use crate::core::store::TopicPermissionRecord;

type Answer = Result<Json<Json_>, ApiError>;

/// A topic permission as RabbitMQ's API and definitions show it.
pub fn topic_permission_json(p: &TopicPermissionRecord) -> Json_ {
    json!({ "user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read })
}

fn listed(ctx: &HttpContext, keep: impl Fn(&TopicPermissionRecord) -> bool) -> Json_ {
    let all = ctx.authz.policy().topic_permission_records();
    Json_::Array(all.iter().filter(|p| keep(p)).map(topic_permission_json).collect())
}

/// `GET /api/topic-permissions`.
pub async fn all(p: Permitted<Administrator>) -> Answer {
    let ctx = p.ctx();
    Ok(Json(listed(ctx, |_| true)))
}

/// `GET /api/vhosts/{vhost}/topic-permissions`.
pub async fn of_vhost(p: Permitted<Vhost<Administrator>>) -> Answer {
    Ok(Json(listed(p.ctx(), |r| r.vhost == p.name)))
}

/// `GET /api/users/{user}/topic-permissions`.
pub async fn of_user(p: Permitted<Administrator>, Path(user): Path<String>) -> Answer {
    let ctx = p.ctx();
    ctx.users.get(&user).ok_or_else(ApiError::not_found)?;
    Ok(Json(listed(ctx, |p| p.user == user)))
}

/// `GET /api/topic-permissions/{vhost}/{user}`: one entry per exchange (404 when none).
pub async fn of_pair(p: Permitted<Administrator>, Path((vhost, user)): Path<(String, String)>) -> Answer {
    let ctx = p.ctx();
    let found = listed(ctx, |p| p.vhost == vhost && p.user == user);
    if found.as_array().is_some_and(Vec::is_empty) {
        return Err(ApiError::not_found());
    }
    Ok(Json(found))
}

/// The body of `PUT /api/topic-permissions/{vhost}/{user}`.
#[derive(Debug, Deserialize)]
pub struct TopicPermissionBody {
    /// The topic exchange.
    pub exchange: String,
    /// Routing keys the user may publish with.
    #[serde(default)]
    pub write: String,
    /// Routing keys the user may bind with.
    #[serde(default)]
    pub read: String,
}

/// `PUT /api/topic-permissions/{vhost}/{user}`.
pub async fn set(
    p: Permitted<Administrator>,
    Path((vhost, user)): Path<(String, String)>,
    Body(b): Body<TopicPermissionBody>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let record = TopicPermissionRecord { vhost, user, exchange: b.exchange, write: b.write, read: b.read };
    let new = put_topic_permission(ctx, record).await?;
    Ok(if new { StatusCode::CREATED } else { StatusCode::NO_CONTENT })
}

/// `DELETE /api/topic-permissions/{vhost}/{user}`: every exchange's.
pub async fn clear(
    p: Permitted<Administrator>,
    Path((vhost, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let doomed: Vec<String> = ctx
        .authz
        .policy()
        .topic_permissions
        .keys()
        .filter(|(v, u, _)| *v == vhost && *u == user)
        .map(|(_, _, x)| x.clone())
        .collect();
    if doomed.is_empty() {
        return Err(ApiError::not_found());
    }
    for x in &doomed {
        let write = ctx.broker.stores().access.remove_topic_permission(&vhost, &user, x);
        ctx.broker.commit(write, Commit::Durable).await.map_err(|e| ApiError::internal(e.to_string()))?;
    }
    ctx.authz.update(|p| p.topic_permissions.retain(|(v, u, _), _| !(*v == vhost && *u == user)));
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/mqtt/rules`: the rules `PUT` sets (or `[[auth.rules]]`), then the ACL
/// files' (shown, not changed here), and whether MQTT authorization is on.
pub async fn mqtt_rules(p: Permitted<Administrator>) -> Answer {
    let ctx = p.ctx();
    let policy = ctx.authz.policy();
    Ok(Json(json!({
        "enabled": ctx.authz.mqtt_enabled(),
        "source": if policy.api_rules { "api" } else { "config" },
        "rules": policy.rule_entries,
        "acl_file_rules": policy.file_rules.len(),
    })))
}

/// `PUT /api/mqtt/rules`: replaces the rules (a JSON array of rules as `[[auth.rules]]`
/// spells them); checked whole first, so a bad rule changes nothing.
pub async fn set_mqtt_rules(
    p: Permitted<Administrator>,
    Body(entries): Body<Vec<RuleEntry>>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let rules = rules_of(&entries).map_err(ApiError::bad_request)?;
    let text = serde_json::to_string(&entries).map_err(|e| ApiError::internal(e.to_string()))?;
    let write = ctx.broker.stores().access.put_mqtt_rules(&text);
    ctx.broker.commit(write, Commit::Durable).await.map_err(|e| ApiError::internal(e.to_string()))?;
    if !super::access::applied_by_commit(ctx) {
        ctx.authz.update(|p| {
            p.rules = rules;
            p.rule_entries = entries;
            p.api_rules = true;
        });
    }
    Ok(StatusCode::NO_CONTENT)
}
