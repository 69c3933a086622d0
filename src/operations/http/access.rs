//! `/api/vhosts`, `/api/users`, `/api/permissions`, `/api/topic-permissions` and
//! `/api/mqtt/rules`: listed, created, changed and deleted as in RabbitMQ, kept in the
//! core's access store so they survive restarts. Permissions and rules live in the
//! authorizer both front-ends decide with, so a change applies to open connections at
//! their next request.

use std::collections::HashMap;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::{json, Value as Json_};

use super::error::ApiError;
use super::json::Body;
use super::permit::{Administrator, Management, Permitted, Vhost, VisibleVhost};
use super::queues::QueueTotals;
use super::HttpContext;
use crate::access::auth::{Secret, User};
use crate::composition::config::Config;
use crate::core::broker::Commit;
use crate::core::limits::LimitScope;
use crate::core::store::{
    AccessCommand, AccessRecords, PermissionRecord, StoreWrite, TopicPermissionRecord, UserRecord, VhostRecord,
};

type Answer = Result<Json<Json_>, ApiError>;

/// What the API keeps about virtual hosts beside the router and the users (permissions
/// are the authorizer's).
#[derive(Debug, Default)]
pub struct AccessState {
    /// Description and tags of each virtual host.
    vhost_meta: RwLock<HashMap<String, (String, Vec<String>)>>,
    /// Users and virtual hosts the configuration names (deleting one leaves a tombstone).
    configured_users: Vec<String>,
    configured_vhosts: Vec<String>,
    /// The cluster name `/api/overview` reports: set through the API or an imported
    /// definitions file (kept), else `http.cluster_name`.
    cluster_name: RwLock<String>,
}

impl AccessState {
    /// The state at start, from the configuration and the stored records.
    pub fn restore(config: &Config, records: &AccessRecords) -> AccessState {
        let configured_users: Vec<String> = config.auth.all_users().into_iter().map(|u| u.name).collect();
        let vhost_meta = records
            .vhosts
            .iter()
            .filter(|v| !v.deleted)
            .map(|v| (v.name.clone(), (v.description.clone(), v.tags.clone())))
            .collect();
        let stored_name = records
            .global_parameters
            .iter()
            .find(|(name, _)| name == super::cluster::CLUSTER_NAME)
            .and_then(|(_, value)| serde_json::from_str::<String>(value).ok());
        AccessState {
            vhost_meta: RwLock::new(vhost_meta),
            configured_users,
            configured_vhosts: config.auth.vhosts.clone(),
            cluster_name: RwLock::new(stored_name.unwrap_or_else(|| config.http.cluster_name.clone())),
        }
    }

    /// The cluster name.
    pub fn cluster_name(&self) -> String {
        self.cluster_name.read().clone()
    }

    /// Changes the cluster name (the caller stored it).
    pub fn set_cluster_name(&self, name: &str) {
        *self.cluster_name.write() = name.to_owned();
    }

    /// Description and tags of a virtual host.
    pub fn vhost_meta(&self, name: &str) -> (String, Vec<String>) {
        self.vhost_meta.read().get(name).cloned().unwrap_or_default()
    }
}

pub(crate) async fn commit(ctx: &HttpContext, write: StoreWrite) -> Result<(), ApiError> {
    ctx.broker.commit(write, Commit::Durable).await.map_err(|e| ApiError::internal(e.to_string()))
}

/// True when a commit has applied its change to this member's memory already: on a cluster
/// member the metadata group applies every committed change, in log order
/// ([`apply_committed`]). The caller then leaves memory alone, so that a later change
/// applied meanwhile (from another member) is not overwritten by this one's.
pub(crate) fn applied_by_commit(ctx: &HttpContext) -> bool {
    ctx.entities.is_replicated()
}

/// Applies to memory a change to users, virtual hosts, permissions, MQTT rules, limits or
/// the cluster name that a cluster's metadata group committed (possibly made on another
/// member): what the API's own calls do after their commit, idempotently. A deleted user's
/// connections here are closed.
pub fn apply_committed(ctx: &HttpContext, command: &AccessCommand) {
    match command {
        AccessCommand::PutUser(r) if r.deleted => forget_user(ctx, &r.name),
        AccessCommand::PutUser(r) => {
            if let Some(user) = crate::access::auth::user_from_record(r, &ctx.loopback_users) {
                ctx.authz.update(|p| p.user_tags.insert(r.name.clone(), r.tags.clone()));
                ctx.users.put(user);
            }
        }
        AccessCommand::RemoveUser { name } => forget_user(ctx, name),
        AccessCommand::PutVhost(r) if r.deleted => forget_vhost(ctx, &r.name),
        AccessCommand::PutVhost(r) => {
            ctx.broker.add_vhost(&r.name);
            ctx.access.vhost_meta.write().insert(r.name.clone(), (r.description.clone(), r.tags.clone()));
        }
        AccessCommand::RemoveVhost { name } => forget_vhost(ctx, name),
        AccessCommand::PutPermission(p) => {
            let _ = ctx.authz.update(|policy| policy.set_permission(p));
        }
        AccessCommand::RemovePermission { vhost, user } => {
            ctx.authz.update(|p| p.permissions.remove(&(vhost.clone(), user.clone())));
        }
        AccessCommand::PutTopicPermission(p) => {
            let _ = ctx.authz.update(|policy| policy.set_topic_permission(p));
        }
        AccessCommand::RemoveTopicPermission { vhost, user, exchange } => {
            ctx.authz.update(|p| p.topic_permissions.remove(&(vhost.clone(), user.clone(), exchange.clone())));
        }
        AccessCommand::PutMqttRules { json } => {
            let entries: Vec<crate::access::authz::RuleEntry> = serde_json::from_str(json).unwrap_or_default();
            match crate::access::authz::rules_of(&entries) {
                Ok(rules) => ctx.authz.update(|p| {
                    p.rules = rules;
                    p.rule_entries = entries;
                    p.api_rules = true;
                }),
                Err(e) => tracing::warn!(error = %e, "committed MQTT rules not applied"),
            }
        }
        AccessCommand::PutLimits(r) => ctx.broker.set_limits(r.scope, &r.owner, r.values.clone()),
        AccessCommand::PutGlobalParameter { name, value } if name == super::cluster::CLUSTER_NAME => {
            if let Ok(name) = serde_json::from_str::<String>(value) {
                ctx.access.set_cluster_name(&name);
            }
        }
        // Runtime parameters are not replicated (see crate::cluster's metadata module).
        _ => {}
    }
}

fn forget_user(ctx: &HttpContext, name: &str) {
    if ctx.users.remove(name) {
        ctx.authz.update(|p| p.user_tags.remove(name));
        for c in ctx.broker.connections().list().into_iter().filter(|c| c.user == name) {
            c.close("user deleted");
        }
    }
}

fn forget_vhost(ctx: &HttpContext, name: &str) {
    if ctx.broker.routing().has_vhost(name) {
        for c in ctx.broker.connections().list().into_iter().filter(|c| c.vhost == name) {
            c.close(&format!("vhost '{name}' is deleted"));
        }
        ctx.broker.remove_vhost(name);
    }
    ctx.access.vhost_meta.write().remove(name);
}

/// A virtual host as RabbitMQ's API shows it.
pub fn vhost_json(ctx: &HttpContext, name: &str) -> Json_ {
    let q = QueueTotals::of_vhost(ctx, Some(name));
    let (description, tags) = ctx.access.vhost_meta(name);
    let mut v = json!({
        "name": name,
        "description": description,
        "tags": tags,
        "default_queue_type": "classic",
        "metadata": { "description": description, "tags": tags },
        "tracing": false,
        "cluster_state": { ctx.node(): "running" },
    });
    if let (Json_::Object(o), Json_::Object(t)) = (&mut v, q.json()) {
        o.extend(t);
    }
    v
}

/// Creates or updates a virtual host; true when it is new.
pub async fn put_vhost(
    ctx: &HttpContext,
    name: &str,
    description: String,
    tags: Vec<String>,
) -> Result<bool, ApiError> {
    if name.is_empty() {
        return Err(ApiError::bad_request("a virtual host needs a name"));
    }
    let record =
        VhostRecord { name: name.into(), description: description.clone(), tags: tags.clone(), deleted: false };
    // Known before the commit: on a cluster member the commit applies it to memory too.
    let created = !ctx.broker.routing().has_vhost(name);
    commit(ctx, ctx.broker.stores().access.put_vhost(&record)).await?;
    if !applied_by_commit(ctx) {
        ctx.broker.add_vhost(name);
        ctx.access.vhost_meta.write().insert(name.into(), (description, tags));
    }
    Ok(created)
}

/// Deletes a virtual host: closes its connections, deletes its queues and exchanges.
pub async fn delete_vhost(ctx: &HttpContext, name: &str) -> Result<(), ApiError> {
    if !ctx.broker.routing().has_vhost(name) {
        return Err(ApiError::not_found());
    }
    if name == crate::core::router::MQTT_VHOST {
        return Err(ApiError::bad_request("virtual host '/' carries MQTT and cannot be deleted"));
    }
    for c in ctx.broker.connections().list().into_iter().filter(|c| c.vhost == name) {
        c.close(&format!("vhost '{name}' is deleted"));
    }
    ctx.entities.delete_vhost_entities(name).await;
    let store = &ctx.broker.stores().access;
    let write = if ctx.access.configured_vhosts.iter().any(|v| v == name) {
        store.put_vhost(&VhostRecord { name: name.into(), description: String::new(), tags: vec![], deleted: true })
    } else {
        store.remove_vhost(name)
    };
    commit(ctx, write).await?;
    forget_permissions(ctx, |vhost, _| vhost == name).await?;
    super::limits::replace_limits(ctx, LimitScope::Vhost, name, Default::default()).await?;
    if !applied_by_commit(ctx) {
        ctx.broker.remove_vhost(name);
        ctx.access.vhost_meta.write().remove(name);
    }
    Ok(())
}

/// A user as RabbitMQ's API shows it, with its limits.
pub fn user_json(ctx: &HttpContext, u: &User) -> Json_ {
    let (hash, algorithm) = u.secret.exported();
    let limits = ctx.broker.limits().of(LimitScope::User, &u.name);
    json!({ "name": u.name, "tags": u.tags, "password_hash": hash, "hashing_algorithm": algorithm, "limits": limits })
}

/// Creates or replaces a user; true when it is new.
pub async fn put_user(ctx: &HttpContext, name: &str, secret: Secret, tags: Vec<String>) -> Result<bool, ApiError> {
    if name.is_empty() {
        return Err(ApiError::bad_request("a user needs a name"));
    }
    let (password_hash, hashing_algorithm) = secret.exported();
    let record = UserRecord {
        name: name.into(),
        password_hash: password_hash.clone(),
        hashing_algorithm: hashing_algorithm.into(),
        tags: tags.clone(),
        deleted: false,
    };
    let user = crate::access::auth::user_from_record(&record, &ctx.loopback_users)
        .ok_or_else(|| ApiError::bad_request("unknown hashing algorithm"))?;
    // Known before the commit: on a cluster member the commit applies it to memory too.
    let created = ctx.users.get(name).is_none();
    commit(ctx, ctx.broker.stores().access.put_user(&record)).await?;
    if !applied_by_commit(ctx) {
        // Rules naming a group (a tag) see the new tags on open connections too.
        ctx.authz.update(|p| p.user_tags.insert(name.to_owned(), tags));
        ctx.users.put(user);
    }
    Ok(created)
}

/// Deletes a user and its permissions.
pub async fn delete_user(ctx: &HttpContext, name: &str) -> Result<(), ApiError> {
    if ctx.users.get(name).is_none() {
        return Err(ApiError::not_found());
    }
    let store = &ctx.broker.stores().access;
    let write = if ctx.access.configured_users.iter().any(|u| u == name) {
        let tombstone = UserRecord {
            name: name.into(),
            password_hash: String::new(),
            hashing_algorithm: String::new(),
            tags: vec![],
            deleted: true,
        };
        store.put_user(&tombstone)
    } else {
        store.remove_user(name)
    };
    commit(ctx, write).await?;
    forget_permissions(ctx, |_, user| user == name).await?;
    super::limits::replace_limits(ctx, LimitScope::User, name, Default::default()).await?;
    if !applied_by_commit(ctx) {
        // As RabbitMQ: a deleted user's open connections are closed (AMQP 320, MQTT 5 0x98).
        forget_user(ctx, name);
    }
    Ok(())
}

/// Removes the permissions and topic permissions of (vhost, user) pairs `doomed` picks.
async fn forget_permissions(ctx: &HttpContext, doomed: impl Fn(&str, &str) -> bool) -> Result<(), ApiError> {
    let policy = ctx.authz.policy();
    let store = &ctx.broker.stores().access;
    for ((v, u), _) in policy.permissions.iter().filter(|((v, u), _)| doomed(v, u)) {
        commit(ctx, store.remove_permission(v, u)).await?;
    }
    for ((v, u, x), _) in policy.topic_permissions.iter().filter(|((v, u, _), _)| doomed(v, u)) {
        commit(ctx, store.remove_topic_permission(v, u, x)).await?;
    }
    if applied_by_commit(ctx) {
        return Ok(());
    }
    ctx.authz.update(|p| {
        p.permissions.retain(|(v, u), _| !doomed(v, u));
        p.topic_permissions.retain(|(v, u, _), _| !doomed(v, u));
    });
    Ok(())
}

/// Sets a user's permissions in a virtual host; true when it had none.
pub async fn put_permission(ctx: &HttpContext, p: PermissionRecord) -> Result<bool, ApiError> {
    if !ctx.broker.routing().has_vhost(&p.vhost) || ctx.users.get(&p.user).is_none() {
        return Err(ApiError::bad_request(format!("no user '{}' or no vhost '{}'", p.user, p.vhost)));
    }
    crate::access::authz::VhostPermissions::new(&p.configure, &p.write, &p.read).map_err(ApiError::bad_request)?;
    let key = (p.vhost.clone(), p.user.clone());
    let new = !ctx.authz.policy().permissions.contains_key(&key);
    commit(ctx, ctx.broker.stores().access.put_permission(&p)).await?;
    if !applied_by_commit(ctx) {
        ctx.authz.update(|policy| policy.set_permission(&p)).map_err(ApiError::bad_request)?;
    }
    Ok(new)
}

/// Sets a user's topic permissions on an exchange; true when it had none.
pub async fn put_topic_permission(ctx: &HttpContext, p: TopicPermissionRecord) -> Result<bool, ApiError> {
    if !ctx.broker.routing().has_vhost(&p.vhost) || ctx.users.get(&p.user).is_none() {
        return Err(ApiError::bad_request(format!("no user '{}' or no vhost '{}'", p.user, p.vhost)));
    }
    if p.exchange.is_empty() {
        return Err(ApiError::bad_request("topic permissions need an exchange"));
    }
    crate::access::authz::TopicPermissions::new(&p.write, &p.read).map_err(ApiError::bad_request)?;
    let key = (p.vhost.clone(), p.user.clone(), p.exchange.clone());
    let new = !ctx.authz.policy().topic_permissions.contains_key(&key);
    commit(ctx, ctx.broker.stores().access.put_topic_permission(&p)).await?;
    if !applied_by_commit(ctx) {
        ctx.authz.update(|policy| policy.set_topic_permission(&p)).map_err(ApiError::bad_request)?;
    }
    Ok(new)
}

/// `GET /api/vhosts`: the virtual hosts the caller may open (every one to monitoring
/// users and administrators, as RabbitMQ).
pub async fn vhosts(p: Permitted<Management>) -> Answer {
    let ctx = p.ctx();
    Ok(Json(Json_::Array(ctx.vhosts().iter().filter(|v| p.sees_vhost(v)).map(|v| vhost_json(ctx, v)).collect())))
}

/// `GET /api/vhosts/{name}`.
pub async fn vhost(p: Permitted<VisibleVhost>) -> Answer {
    Ok(Json(vhost_json(p.ctx(), &p.name)))
}

/// The body of `PUT /api/vhosts/{name}`.
#[derive(Debug, Default, Deserialize)]
pub struct VhostBody {
    /// Description (kept when absent).
    #[serde(default)]
    pub description: Option<String>,
    /// Tags: a list, or RabbitMQ's comma-separated text (kept when absent).
    #[serde(default)]
    pub tags: Option<Json_>,
    /// Ignored (every queue is classic unless declared otherwise).
    #[serde(default)]
    pub default_queue_type: Option<String>,
    /// Ignored.
    #[serde(default, deserialize_with = "super::json::lenient::opt_bool")]
    pub tracing: Option<bool>,
}

/// Tags given as a list or as comma-separated text.
pub fn tag_list(tags: &Option<Json_>) -> Vec<String> {
    match tags {
        Some(Json_::String(s)) => s.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect(),
        Some(Json_::Array(a)) => a.iter().filter_map(|t| t.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}

fn created(new: bool) -> StatusCode {
    if new {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    }
}

/// `PUT /api/vhosts/{name}`.
pub async fn create_vhost(
    p: Permitted<Administrator>,
    Path(name): Path<String>,
    Body(body): Body<VhostBody>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let (description, tags) = ctx.access.vhost_meta(&name);
    let description = body.description.unwrap_or(description);
    let tags = if body.tags.is_some() { tag_list(&body.tags) } else { tags };
    Ok(created(put_vhost(ctx, &name, description, tags).await?))
}

/// `DELETE /api/vhosts/{name}`.
pub async fn remove_vhost(p: Permitted<Administrator>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    delete_vhost(ctx, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/users`.
pub async fn users(p: Permitted<Administrator>) -> Answer {
    let ctx = p.ctx();
    Ok(Json(Json_::Array(ctx.users.all().iter().map(|u| user_json(ctx, u)).collect())))
}

/// `GET /api/users/{name}`.
pub async fn user(p: Permitted<Administrator>, Path(name): Path<String>) -> Answer {
    let ctx = p.ctx();
    let u = ctx.users.get(&name).ok_or_else(ApiError::not_found)?;
    Ok(Json(user_json(ctx, &u)))
}

/// The body of `PUT /api/users/{name}`.
#[derive(Debug, Default, Deserialize)]
pub struct UserBody {
    /// Password in clear (stored hashed).
    pub password: Option<String>,
    /// Or a RabbitMQ password hash.
    pub password_hash: Option<String>,
    /// Its algorithm (default `rabbit_password_hashing_sha256`).
    pub hashing_algorithm: Option<String>,
    /// Tags: a list, or RabbitMQ's comma-separated text.
    pub tags: Option<Json_>,
}

/// The secret a user body gives (`password`, else `password_hash`, else no password).
pub fn secret_of(password: Option<String>, hash: Option<String>, algorithm: Option<&str>) -> Result<Secret, ApiError> {
    if let Some(p) = password {
        return Ok(Secret::from_password(&p));
    }
    Secret::from_hash(&hash.unwrap_or_default(), algorithm).map_err(ApiError::bad_request)
}

/// `PUT /api/users/{name}`.
pub async fn create_user(
    p: Permitted<Administrator>,
    Path(name): Path<String>,
    Body(body): Body<UserBody>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    let secret = secret_of(body.password, body.password_hash, body.hashing_algorithm.as_deref())?;
    Ok(created(put_user(ctx, &name, secret, tag_list(&body.tags)).await?))
}

/// `DELETE /api/users/{name}` (its open connections are closed).
pub async fn remove_user(p: Permitted<Administrator>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    delete_user(ctx, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn permission_json(p: &PermissionRecord) -> Json_ {
    json!({ "user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write, "read": p.read })
}

/// `GET /api/permissions`.
pub async fn permissions(p: Permitted<Administrator>) -> Answer {
    let ctx = p.ctx();
    Ok(Json(Json_::Array(ctx.authz.policy().permission_records().iter().map(permission_json).collect())))
}

/// `GET /api/vhosts/{vhost}/permissions`.
pub async fn vhost_permissions(p: Permitted<Vhost<Administrator>>) -> Answer {
    let all = p.ctx().authz.policy().permission_records().into_iter().filter(|r| r.vhost == p.name);
    Ok(Json(Json_::Array(all.map(|p| permission_json(&p)).collect())))
}

/// `GET /api/users/{user}/permissions`.
pub async fn user_permissions(p: Permitted<Administrator>, Path(user): Path<String>) -> Answer {
    let ctx = p.ctx();
    ctx.users.get(&user).ok_or_else(ApiError::not_found)?;
    let all = ctx.authz.policy().permission_records().into_iter().filter(|p| p.user == user);
    Ok(Json(Json_::Array(all.map(|p| permission_json(&p)).collect())))
}

/// `GET /api/permissions/{vhost}/{user}`.
pub async fn permission(p: Permitted<Administrator>, Path((vhost, user)): Path<(String, String)>) -> Answer {
    let found = p.ctx().authz.policy().permission_records().into_iter().find(|r| r.vhost == vhost && r.user == user);
    Ok(Json(permission_json(&found.ok_or_else(ApiError::not_found)?)))
}

/// The body of `PUT /api/permissions/{vhost}/{user}`.
#[derive(Debug, Deserialize)]
pub struct PermissionBody {
    /// Configure regex.
    #[serde(default)]
    pub configure: String,
    /// Write regex.
    #[serde(default)]
    pub write: String,
    /// Read regex.
    #[serde(default)]
    pub read: String,
}

/// `PUT /api/permissions/{vhost}/{user}`.
pub async fn set_permission(
    p: Permitted<Administrator>,
    Path((vhost, user)): Path<(String, String)>,
    Body(b): Body<PermissionBody>,
) -> Result<StatusCode, ApiError> {
    let record = PermissionRecord { vhost, user, configure: b.configure, write: b.write, read: b.read, cleared: false };
    Ok(created(put_permission(p.ctx(), record).await?))
}

/// `DELETE /api/permissions/{vhost}/{user}`: the user keeps no permission there (a
/// tombstone, so a configured default does not come back at restart).
pub async fn clear_permission(
    p: Permitted<Administrator>,
    Path((vhost, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let ctx = p.ctx();
    if !ctx.authz.policy().permissions.contains_key(&(vhost.clone(), user.clone())) {
        return Err(ApiError::not_found());
    }
    let none = PermissionRecord {
        vhost,
        user,
        configure: String::new(),
        write: String::new(),
        read: String::new(),
        cleared: true,
    };
    commit(ctx, ctx.broker.stores().access.put_permission(&none)).await?;
    if !applied_by_commit(ctx) {
        ctx.authz.update(|p| p.set_permission(&none)).map_err(ApiError::bad_request)?;
    }
    Ok(StatusCode::NO_CONTENT)
}
