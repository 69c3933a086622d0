//! Who may connect and what they may do: logins, password files, topic and vhost permissions, TLS client certificates.

mod authz;
mod logins;
mod tls_clients;
