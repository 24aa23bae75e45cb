//! The demo on PostgreSQL (`weir-demo --sink postgres`): the job's results go into a table of
//! a real server — started with `tools/postgres/server.sh` (Debian's PostgreSQL, initdb into a
//! temporary directory as an unprivileged user, a loopback port; removed at the end), or one
//! the user names — and the slow phase is the database's own: an index on the target table,
//! built concurrently, whose expression costs the server real work for every row written
//! (a partial index over the rows of the slow phase on, so its build does not scan old rows
//! expensively). While it exists every insert pays for it, the sink's batches in flight reach
//! their bound, and backpressure goes back to Kafka; dropping it ends the slow phase. The
//! verdict reads the table back with SQL (through psql).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The script that starts and stops the server (`tools/postgres/server.sh` of this checkout).
const SERVER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../postgres/server.sh");

/// The table of results, and the slow index's function and name.
pub const TABLE: &str = "weir_demo_clicks";
const HEAVY: &str = "weir_demo_heavy";
const INDEX: &str = "weir_demo_heavy_idx";
/// How much work the index's expression is per row: the sum of this many terms (about
/// 0.4 ms of one core per row on a 2020s laptop core: a few thousand rows per second).
const HEAVY_TERMS: u32 = 2000;

/// The server the demo writes into.
pub struct PgDemo {
    /// The connection string for the sink and psql.
    pub url: String,
    /// The server's directory, when the demo started it (stopped and removed on drop).
    own: Option<PathBuf>,
}

impl PgDemo {
    /// Start a server (or use `given`), and make the table and the index's function.
    pub fn start(given: Option<&str>) -> Result<PgDemo, String> {
        let demo = match given {
            Some(url) => PgDemo { url: url.to_owned(), own: None },
            None => {
                let dir = std::env::temp_dir().join(format!("weir-demo-pg-{}", std::process::id()));
                let out = Command::new(SERVER_SH)
                    .arg("start")
                    .env("WEIR_PG_DIR", &dir)
                    .output()
                    .map_err(|e| format!("cannot run {SERVER_SH}: {e}"))?;
                if !out.status.success() {
                    let _ = Command::new(SERVER_SH).arg("stop").env("WEIR_PG_DIR", &dir).output();
                    return Err(format!(
                        "cannot start PostgreSQL with {SERVER_SH} (apt-get install postgresql): {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                let said = String::from_utf8_lossy(&out.stdout);
                let url = said.lines().find_map(|l| l.strip_prefix("url=")).ok_or("server.sh said no url")?.to_owned();
                PgDemo { url, own: Some(dir) }
            }
        };
        demo.sql(&format!(
            "DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (user_id int8 NOT NULL, window_end timestamptz NOT \
             NULL, clicks int8 NOT NULL, PRIMARY KEY (user_id, window_end)); CREATE OR REPLACE FUNCTION {HEAVY}(a \
             int8, b int8) RETURNS int8 IMMUTABLE LANGUAGE sql AS $$ SELECT sum(i * a + b) FROM generate_series(1, \
             {HEAVY_TERMS}) i $$"
        ))?;
        Ok(demo)
    }

    /// The same server, for another thread (stops nothing on drop).
    pub fn at(url: &str) -> PgDemo {
        PgDemo { url: url.to_owned(), own: None }
    }

    /// Run `sql` with psql; its rows as `a|b` lines.
    pub fn sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("psql")
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", &self.url, "-c", sql])
            .output()
            .map_err(|e| format!("cannot run psql (apt-get install postgresql-client): {e}"))?;
        if !out.status.success() {
            return Err(format!("psql: {sql}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The slow phase begins: build the expensive index concurrently (over the rows from now
    /// on). Returns when it is built; inserts pay for it from then on.
    pub fn slow_index_on(&self) -> Result<Duration, String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let started = std::time::Instant::now();
        self.sql(&format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {TABLE} ({HEAVY}(user_id, clicks)) WHERE window_end \
             >= to_timestamp({now})"
        ))?;
        Ok(started.elapsed())
    }

    /// The slow phase ends: drop the index.
    pub fn slow_index_off(&self) -> Result<(), String> {
        self.sql(&format!("DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")).map(|_| ())
    }

    /// What the table holds: the sum of the clicks, the rows, the distinct (user, window)
    /// pairs; and the prepared transactions left behind.
    pub fn counts(&self) -> Result<(u64, u64, u64, u64), String> {
        let row = self.sql(&format!(
            "SELECT coalesce(sum(clicks), 0), count(*), count(DISTINCT (user_id, window_end)), (SELECT count(*) FROM \
             pg_prepared_xacts WHERE gid LIKE 'demo/%') FROM {TABLE}"
        ))?;
        let v: Vec<u64> = row.split('|').filter_map(|x| x.trim().parse().ok()).collect();
        match v[..] {
            [a, b, c, d] => Ok((a, b, c, d)),
            _ => Err(format!("unexpected answer `{row}`")),
        }
    }
}

impl Drop for PgDemo {
    fn drop(&mut self) {
        if let Some(dir) = &self.own {
            let _ = Command::new(SERVER_SH).arg("stop").env("WEIR_PG_DIR", dir).output();
        }
    }
}
