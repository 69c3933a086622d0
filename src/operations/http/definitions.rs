//! `/api/definitions[/{vhost}]`: RabbitMQ's definitions JSON (`rabbit_version, users,
//! vhosts, permissions, topic_permissions, parameters, global_parameters, policies,
//! queues, exchanges, bindings`), exported and imported, so `rabbitmqadmin export` of a
//! RabbitMQ node imports into FerryMQ and back. What FerryMQ does not apply (policies,
//! runtime parameters other than shovels and `vhost-limits`, global parameters other than `cluster_name`,
//! password hashes of an algorithm FerryMQ cannot verify, sections and keys it
//! does not know) is listed in the import's answer under `unsupported`, never dropped
//! silently. The same import runs at start for `--definitions FILE` /
//! `http.load_definitions`, which logs each.

use axum::Json;
use serde_json::{json, Map, Value as Json_};

use super::access::{put_permission, put_topic_permission, put_user, put_vhost, secret_of, tag_list, user_json};
use super::error::ApiError;
use super::exchanges::{set_binding, user_bindings, user_exchanges, BindingSpec};
use super::json::{json_table, table_json, Body};
use super::limits::{definitions_json, from_definitions, replace_limits};
use super::overview::RABBITMQ_API_VERSION;
use super::permit::{Administrator, BindingGrant, Permitted, Vhost};
use super::HttpContext;
use crate::core::entities::check_equivalent_queue;
use crate::core::limits::LimitScope;
use crate::core::router::{ExchangeDef, ExchangeKind};
use crate::core::store::{PermissionRecord, TopicPermissionRecord};

type Answer = Result<Json<Json_>, ApiError>;

fn queues(ctx: &HttpContext, vhost: &str) -> Vec<Json_> {
    let mut qs: Vec<_> =
        ctx.entities.all().into_iter().filter(|q| q.vhost == vhost && q.exclusive_owner.is_none()).collect();
    qs.sort_by(|a, b| a.name.cmp(&b.name));
    qs.iter()
        .map(|q| {
            json!({
                "name": q.name, "vhost": q.vhost, "durable": q.durable,
                "auto_delete": q.auto_delete, "arguments": table_json(&q.arguments),
            })
        })
        .collect()
}

fn without(mut rows: Vec<Json_>, keys: &[&str]) -> Vec<Json_> {
    for r in &mut rows {
        if let Json_::Object(o) = r {
            for k in keys {
                o.remove(*k);
            }
        }
    }
    rows
}

/// The definitions of everything (`vhost = None`) or of one virtual host.
pub fn export(ctx: &HttpContext, vhost: Option<&str>) -> Json_ {
    let vhosts: Vec<String> = ctx.vhosts().into_iter().filter(|v| vhost.is_none_or(|only| only == v)).collect();
    let (mut qs, mut xs, mut bs) = (Vec::new(), Vec::new(), Vec::new());
    for v in &vhosts {
        qs.extend(queues(ctx, v));
        xs.extend(without(user_exchanges(ctx, v), &["user_who_performed_action", "policy"]));
        bs.extend(without(user_bindings(ctx, v), &["properties_key"]));
    }
    let mut out = json!({
        "rabbit_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "FerryMQ",
        "product_version": env!("CARGO_PKG_VERSION"),
        "parameters": parameters(ctx, vhost),
        "policies": [],
        "queues": qs,
        "exchanges": xs,
        "bindings": bs,
    });
    if vhost.is_none() {
        let users: Vec<Json_> = ctx
            .users
            .all()
            .iter()
            .map(|u| {
                let (hash, algorithm) = u.secret.exported();
                let mut j = user_json(ctx, u);
                j["limits"] = definitions_json(&ctx.broker.limits().of(LimitScope::User, &u.name));
                j["password_hash"] = json!(hash);
                j["hashing_algorithm"] = json!(algorithm);
                j
            })
            .collect();
        let vhost_rows: Vec<Json_> = vhosts
            .iter()
            .map(|v| {
                let (description, tags) = ctx.access.vhost_meta(v);
                let limits = definitions_json(&ctx.broker.limits().of(LimitScope::Vhost, v));
                json!({ "name": v, "limits": limits, "metadata": { "description": description, "tags": tags } })
            })
            .collect();
        let policy = ctx.authz.policy();
        let permissions: Vec<Json_> = policy
            .permission_records()
            .iter()
            .map(|p| json!({ "user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write, "read": p.read }))
            .collect();
        let topic_permissions: Vec<Json_> =
            policy.topic_permission_records().iter().map(super::rules::topic_permission_json).collect();
        let o = out.as_object_mut().expect("an object");
        o.insert("users".into(), Json_::Array(users));
        o.insert("vhosts".into(), Json_::Array(vhost_rows));
        o.insert("permissions".into(), Json_::Array(permissions));
        o.insert("topic_permissions".into(), Json_::Array(topic_permissions));
        o.insert("global_parameters".into(), Json_::Array(super::cluster::global_parameters(ctx)));
    }
    out
}

/// The runtime parameters: shovels, and each virtual host's limits as RabbitMQ keeps them
/// (component `vhost-limits`, name `limits`).
fn parameters(ctx: &HttpContext, vhost: Option<&str>) -> Json_ {
    let mut all = super::shovels::parameters(ctx, vhost);
    for (owner, values) in ctx.broker.limits().all(LimitScope::Vhost) {
        if vhost.is_none_or(|v| v == owner) {
            all.push(json!({ "vhost": owner, "component": VHOST_LIMITS, "name": "limits", "value": values }));
        }
    }
    Json_::Array(all)
}

/// The runtime-parameter component of virtual host limits.
const VHOST_LIMITS: &str = "vhost-limits";

/// `GET /api/definitions`.
pub async fn export_all(p: Permitted<Administrator>) -> Answer {
    Ok(Json(export(p.ctx(), None)))
}

/// `GET /api/definitions/{vhost}`.
pub async fn export_vhost(p: Permitted<Vhost<Administrator>>) -> Answer {
    Ok(Json(export(p.ctx(), Some(&p.name))))
}

/// The sections of a definitions file, with the keys of their items the import reads.
const SECTIONS: [(&str, &[&str]); 10] = [
    ("users", &["name", "password", "password_hash", "hashing_algorithm", "tags", "limits"]),
    ("vhosts", &["name", "description", "tags", "metadata", "limits", "default_queue_type"]),
    ("permissions", &["user", "vhost", "configure", "write", "read"]),
    ("topic_permissions", &["user", "vhost", "exchange", "write", "read"]),
    ("parameters", &["value", "vhost", "component", "name"]),
    ("global_parameters", &["name", "value"]),
    // Reported whole, item by item.
    ("policies", &[]),
    ("queues", &["name", "vhost", "durable", "auto_delete", "arguments", "type"]),
    ("exchanges", &["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"]),
    ("bindings", &["source", "vhost", "destination", "destination_type", "routing_key", "arguments"]),
];

/// Keys that describe the file rather than the broker.
const METADATA: [&str; 4] = ["rabbit_version", "rabbitmq_version", "product_name", "product_version"];

/// Sections of the node as a whole, which a virtual host's import does not take.
const NODE_SECTIONS: [&str; 5] = ["users", "vhosts", "permissions", "topic_permissions", "global_parameters"];

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    /// Items applied, by kind.
    pub imported: Map<String, Json_>,
    /// Items not applied because FerryMQ does not support them, with the reason.
    pub unsupported: Vec<Json_>,
}

impl ImportReport {
    /// Reports what the file holds that the import will not read: sections it does not
    /// know (or, for a virtual host's import, sections of the node), and keys of items it
    /// does not read (once per section and key, with how many items had it).
    fn unknown(&mut self, defs: &Json_, only_vhost: Option<&str>) {
        let Some(top) = defs.as_object() else { return };
        for (key, value) in top {
            let empty = value.is_null() || value.as_array().is_some_and(Vec::is_empty);
            if METADATA.contains(&key.as_str()) || empty {
                continue;
            }
            let Some(&(_, keys)) = SECTIONS.iter().find(|(name, _)| name == key) else {
                self.section(key, "not a definitions section FerryMQ knows; ignored");
                continue;
            };
            if only_vhost.is_some() && NODE_SECTIONS.contains(&key.as_str()) {
                self.section(
                    key,
                    "a virtual host's import takes queues, exchanges, bindings, parameters and policies only",
                );
                continue;
            }
            let mut extra: std::collections::BTreeMap<&str, u64> = Default::default();
            for item in value.as_array().into_iter().flatten().filter_map(Json_::as_object) {
                for k in item.keys().filter(|k| !keys.is_empty() && !keys.contains(&k.as_str())) {
                    *extra.entry(k).or_default() += 1;
                }
            }
            for (k, items) in extra {
                self.unsupported.push(json!({
                    "kind": "key", "name": format!("{key}[].{k}"), "items": items,
                    "reason": format!("FerryMQ does not read `{k}` of {key}; ignored"),
                }));
            }
        }
    }

    fn section(&mut self, name: &str, reason: &str) {
        self.unsupported.push(json!({ "kind": "section", "name": name, "reason": reason }));
    }

    fn count(&mut self, kind: &str) {
        let n = self.imported.entry(kind.to_string()).or_insert(json!(0));
        *n = json!(n.as_u64().unwrap_or(0) + 1);
    }

    fn skip(&mut self, kind: &str, item: &Json_, reason: &str) {
        let name = item.get("name").cloned().unwrap_or(Json_::Null);
        self.unsupported.push(json!({ "kind": kind, "name": name, "vhost": item.get("vhost"), "reason": reason }));
    }

    /// The import's answer.
    pub fn json(&self) -> Json_ {
        json!({ "imported": self.imported, "unsupported": self.unsupported })
    }
}

fn text<'a>(item: &'a Json_, key: &str) -> &'a str {
    item.get(key).and_then(Json_::as_str).unwrap_or("")
}

fn flag(item: &Json_, key: &str, default: bool) -> bool {
    item.get(key).and_then(Json_::as_bool).unwrap_or(default)
}

fn items<'a>(defs: &'a Json_, key: &str) -> impl Iterator<Item = &'a Json_> {
    defs.get(key).and_then(Json_::as_array).into_iter().flatten()
}

fn args(item: &Json_) -> Vec<(String, crate::core::value::Value)> {
    item.get("arguments").and_then(Json_::as_object).map(json_table).unwrap_or_default()
}

/// While MQTT authorization is on, no route into the MQTT exchange may be set up (an
/// alternate or dead-letter exchange, an exchange-to-exchange binding), as over AMQP and
/// the API's own calls: the MQTT rules are checked where a message is published. Checked
/// before anything is applied.
fn mqtt_routes_refused(ctx: &HttpContext, defs: &Json_, vhost_of: &dyn Fn(&Json_) -> String) -> Result<(), ApiError> {
    use crate::access::authz::MQTT_VHOST;
    if !ctx.authz.mqtt_enabled() {
        return Ok(());
    }
    let mqtt = ctx.broker.routing().mqtt_exchange();
    let into_mqtt = |item: &Json_, target: Option<&str>| vhost_of(item) == MQTT_VHOST && target == Some(mqtt);
    let argument = |item: &Json_, key: &str| {
        item.get("arguments").and_then(|a| a.get(key)).and_then(Json_::as_str).map(str::to_owned)
    };
    let refuse = |what: String| {
        ApiError::bad_request(format!(
            "{what} routes into exchange '{mqtt}' of vhost '{MQTT_VHOST}', which takes MQTT-checked publishes only \
             while MQTT authorization is on; nothing was imported"
        ))
    };
    for x in items(defs, "exchanges") {
        if into_mqtt(x, argument(x, "alternate-exchange").as_deref()) {
            return Err(refuse(format!("exchange '{}' (alternate-exchange)", text(x, "name"))));
        }
    }
    for q in items(defs, "queues") {
        if into_mqtt(q, argument(q, "x-dead-letter-exchange").as_deref()) {
            return Err(refuse(format!("queue '{}' (x-dead-letter-exchange)", text(q, "name"))));
        }
    }
    for b in items(defs, "bindings") {
        if text(b, "destination_type") == "exchange" && into_mqtt(b, Some(text(b, "destination"))) {
            return Err(refuse(format!("the binding from exchange '{}'", text(b, "source"))));
        }
    }
    Ok(())
}

/// Imports definitions; `only_vhost` makes every item belong to that virtual host (the
/// per-vhost import). Stops at the first item that cannot be applied (400, as RabbitMQ).
pub async fn import(ctx: &HttpContext, defs: &Json_, only_vhost: Option<&str>) -> Result<ImportReport, ApiError> {
    if !defs.is_object() {
        return Err(ApiError::bad_request("definitions must be a JSON object"));
    }
    // Expressions are checked before anything is applied: a bad one changes nothing.
    for p in items(defs, "permissions") {
        crate::access::authz::VhostPermissions::new(text(p, "configure"), text(p, "write"), text(p, "read"))
            .map_err(|e| ApiError::bad_request(format!("permissions of user '{}': {e}", text(p, "user"))))?;
    }
    for p in items(defs, "topic_permissions") {
        crate::access::authz::TopicPermissions::new(text(p, "write"), text(p, "read"))
            .map_err(|e| ApiError::bad_request(format!("topic permissions of user '{}': {e}", text(p, "user"))))?;
    }
    let vhost_of = |item: &Json_| only_vhost.map(str::to_owned).unwrap_or_else(|| text(item, "vhost").to_owned());
    // Limits likewise: every one is read before anything is applied. A vhost's limits may
    // come twice (its `limits` and RabbitMQ's `vhost-limits` parameter): one set each.
    let mut vhost_limits = std::collections::BTreeMap::new();
    if only_vhost.is_none() {
        for v in items(defs, "vhosts") {
            vhost_limits.insert(text(v, "name").to_owned(), from_definitions(LimitScope::Vhost, v.get("limits"))?);
        }
    }
    for p in items(defs, "parameters").filter(|p| text(p, "component") == VHOST_LIMITS) {
        let values = from_definitions(LimitScope::Vhost, p.get("value"))?;
        if !values.is_empty() {
            vhost_limits.insert(vhost_of(p), values);
        }
    }
    let mut user_limits = Vec::new();
    if only_vhost.is_none() {
        for u in items(defs, "users") {
            user_limits.push((text(u, "name").to_owned(), from_definitions(LimitScope::User, u.get("limits"))?));
        }
    }
    let mut report = ImportReport::default();
    mqtt_routes_refused(ctx, defs, &vhost_of)?;
    let global = |p: &Json_| match super::cluster::unsupported(text(p, "name")) {
        None => Ok(p.get("value").cloned().unwrap_or_default()),
        Some(why) => Err(why),
    };
    // Checked before anything is applied, as the expressions are.
    if only_vhost.is_none() {
        for p in items(defs, "global_parameters") {
            if let Ok(value) = global(p) {
                if value.as_str().is_none_or(|n| n.trim().is_empty()) {
                    return Err(ApiError::bad_request(
                        "global parameter 'cluster_name': the value is a non-empty string",
                    ));
                }
            }
        }
    }
    report.unknown(defs, only_vhost);
    if only_vhost.is_none() {
        for v in items(defs, "vhosts") {
            let meta = v.get("metadata");
            let queue_type = meta.and_then(|m| m.get("default_queue_type")).or(v.get("default_queue_type"));
            if let Some(t) = queue_type.and_then(Json_::as_str).filter(|t| *t != "classic") {
                report.skip(
                    "vhosts",
                    v,
                    &format!("default_queue_type '{t}' is not applied: queues are classic unless declared otherwise"),
                );
            }
            let description = meta.and_then(|m| m.get("description")).or(v.get("description"));
            let tags = meta.and_then(|m| m.get("tags")).or(v.get("tags")).cloned();
            put_vhost(ctx, text(v, "name"), description.and_then(Json_::as_str).unwrap_or("").into(), tag_list(&tags))
                .await?;
            report.count("vhosts");
        }
        for u in items(defs, "users") {
            let algorithm = u.get("hashing_algorithm").and_then(Json_::as_str);
            let password = u.get("password").and_then(Json_::as_str).map(str::to_owned);
            let hash = u.get("password_hash").and_then(Json_::as_str).map(str::to_owned);
            match secret_of(password, hash, algorithm) {
                Ok(secret) => {
                    put_user(ctx, text(u, "name"), secret, tag_list(&u.get("tags").cloned())).await?;
                    report.count("users");
                }
                Err(e) => report.skip("users", u, &e.reason),
            }
        }
        for (user, values) in user_limits.into_iter().filter(|(_, v)| !v.is_empty()) {
            if ctx.users.get(&user).is_some() {
                replace_limits(ctx, LimitScope::User, &user, values).await?;
                report.count("user_limits");
            }
        }
        for p in items(defs, "permissions") {
            let record = PermissionRecord {
                vhost: text(p, "vhost").into(),
                user: text(p, "user").into(),
                configure: text(p, "configure").into(),
                write: text(p, "write").into(),
                read: text(p, "read").into(),
                cleared: false,
            };
            put_permission(ctx, record).await?;
            report.count("permissions");
        }
        for p in items(defs, "topic_permissions") {
            let record = TopicPermissionRecord {
                vhost: text(p, "vhost").into(),
                user: text(p, "user").into(),
                exchange: text(p, "exchange").into(),
                write: text(p, "write").into(),
                read: text(p, "read").into(),
            };
            put_topic_permission(ctx, record).await?;
            report.count("topic_permissions");
        }
        for p in items(defs, "global_parameters") {
            match global(p) {
                Ok(value) => {
                    super::cluster::set_cluster_name(ctx, &value).await?;
                    report.count("global_parameters");
                }
                Err(why) => report.skip("global_parameters", p, &why),
            }
        }
    }
    for (vhost, values) in vhost_limits.into_iter().filter(|(_, v)| !v.is_empty()) {
        super::queues::known_vhost(ctx, &vhost)?;
        replace_limits(ctx, LimitScope::Vhost, &vhost, values).await?;
        report.count("vhost_limits");
    }
    for p in items(defs, "policies") {
        report.skip("policies", p, "policies are not applied; declare the arguments on the queues instead");
    }
    for x in items(defs, "exchanges") {
        let vhost = vhost_of(x);
        super::queues::known_vhost(ctx, &vhost)?;
        let kind = text(x, "type");
        let Some(kind) = ExchangeKind::parse(kind) else {
            report.skip("exchanges", x, &format!("exchange type '{kind}' is not supported"));
            continue;
        };
        let def = ExchangeDef {
            name: text(x, "name").into(),
            kind,
            durable: flag(x, "durable", true),
            auto_delete: flag(x, "auto_delete", false),
            internal: flag(x, "internal", false),
            arguments: args(x),
        };
        ctx.entities.declare_exchange(&vhost, def).await?;
        report.count("exchanges");
    }
    let queues: Vec<(String, &Json_)> = items(defs, "queues").map(|q| (vhost_of(q), q)).collect();
    let mut rest = &queues[..];
    while !rest.is_empty() {
        // A batch never names a queue twice, so its declarations are independent.
        let mut names = std::collections::HashSet::new();
        let len = rest
            .iter()
            .take(QUEUE_BATCH)
            .take_while(|(vhost, q)| names.insert((vhost.as_str(), text(q, "name"))))
            .count();
        let (batch, tail) = rest.split_at(len);
        rest = tail;
        let declared = futures_util::future::join_all(batch.iter().map(|(vhost, q)| import_queue(ctx, vhost, q))).await;
        for outcome in declared {
            outcome?;
            report.count("queues");
        }
    }
    for b in items(defs, "bindings") {
        let vhost = vhost_of(b);
        let spec = BindingSpec {
            source: text(b, "source"),
            dest_type: text(b, "destination_type"),
            dest: text(b, "destination"),
            key: text(b, "routing_key"),
            args: args(b),
        };
        set_binding(ctx, &vhost, spec, true, BindingGrant::imported()).await.map_err(|e| {
            ApiError::bad_request(format!("binding {} -> {}: {}", text(b, "source"), text(b, "destination"), e.reason))
        })?;
        report.count("bindings");
    }
    // Shovels last: their queues and exchanges exist by now.
    for p in items(defs, "parameters") {
        if text(p, "component") == VHOST_LIMITS {
            continue;
        }
        if text(p, "component") != "shovel" {
            report.skip("parameters", p, "only shovel and vhost-limits parameters are supported (not federation, ...)");
            continue;
        }
        let value = p.get("value").cloned().unwrap_or_default();
        match super::shovels::put_shovel(ctx, &vhost_of(p), text(p, "name"), value).await {
            Ok(_) => report.count("parameters"),
            Err(e) => report.skip("parameters", p, &e.reason),
        }
    }
    Ok(report)
}

/// Queues of an import declared at once: their durable records share group commits, where
/// one after another a 100,000-queue file would wait for 100,000 fsyncs.
const QUEUE_BATCH: usize = 256;

/// Declares one queue of an import, or checks that the existing one is equivalent.
async fn import_queue(ctx: &HttpContext, vhost: &str, q: &Json_) -> Result<(), ApiError> {
    super::queues::known_vhost(ctx, vhost)?;
    let (name, durable, auto_delete) = (text(q, "name"), flag(q, "durable", true), flag(q, "auto_delete", false));
    let mut arguments = args(q);
    // Newer RabbitMQ exports name the queue type beside the arguments too.
    let kind = text(q, "type");
    if !kind.is_empty() && kind != "classic" && !arguments.iter().any(|(k, _)| k == "x-queue-type") {
        arguments.push(("x-queue-type".into(), crate::core::value::Value::Str(kind.into())));
    }
    match ctx.entities.queue(vhost, name) {
        Some(existing) => {
            check_equivalent_queue(&existing, durable, false, auto_delete, &arguments).map_err(ApiError::from)
        }
        None => ctx
            .entities
            .create_queue(vhost, name, durable, None, auto_delete, arguments)
            .await
            .map(drop)
            .map_err(ApiError::from),
    }
}

/// `POST /api/definitions`: 200 with `{"imported": {...}, "unsupported": [...]}`.
pub async fn import_all(p: Permitted<Administrator>, Body(defs): Body<Json_>) -> Answer {
    Ok(Json(import(p.ctx(), &defs, None).await?.json()))
}

/// `POST /api/definitions/{vhost}`.
pub async fn import_vhost(p: Permitted<Vhost<Administrator>>, Body(defs): Body<Json_>) -> Answer {
    Ok(Json(import(p.ctx(), &defs, Some(&p.name)).await?.json()))
}
