/*-------------------------------------------------------------------------
 *
 * stream_registry.c
 *	  The change streams' registry (1.4): projcache.stream_registry and
 *	  projcache.stream_mapping_registry, the SQL functions that change them
 *	  (create_stream, alter_stream, stream_table, stream_snapshot,
 *	  unstream_table, drop_stream), the checks each makes first, and the
 *	  functions behind the views projcache.streams and
 *	  projcache.stream_mappings.
 *
 * The registry is the tables of the database projcache.database, as the
 * named caches' is: these functions refuse to run in another.  Its rows
 * are read and written as the bootstrap superuser (pc_become_extension),
 * by SQL text written here only, with the caller's values as parameters,
 * once the caller's rights are checked:
 *
 *	 - create_stream: EXECUTE on it (not granted to PUBLIC); the caller
 *	   becomes the owner.  A stream of an owner who is not a superuser has
 *	   a password in its connection string and names no file or service
 *	   of this server (stream_conninfo.c, 2F003);
 *	 - alter_stream, drop_stream, stream_table, stream_snapshot,
 *	   unstream_table: the privileges of the stream's owner (superusers
 *	   have them); stream_table also the privileges of the named cache's
 *	   owner, or a superuser for the default cache; stream_snapshot the
 *	   privileges of the snapshot's owner.
 *
 * A stream's owner, a mapping's stream, cache and snapshot are stored by
 * identity: the owner as a regrole (its OID; pg_dump writes its name, and
 * pg_upgrade keeps role OIDs), the stream by its id, a named cache by its
 * name and created_at (a cache dropped and made again is another cache:
 * see create_cache) and a snapshot by its id.  Foreign keys with ON DELETE
 * CASCADE delete a mapping with its stream, its cache or its snapshot.
 *
 * Locks: a change of a stream or of its mappings locks the stream's row
 * (FOR UPDATE), once the caller is known to own it, so that a role that
 * does not own the stream never holds its lock; a mapping's cache or
 * snapshot row is locked FOR KEY SHARE (as its foreign key would), so that
 * it is not dropped under the check of its owner.  create_stream also
 * locks the registry's totals (lock_stream_totals()), so that two of them
 * cannot both take the last of projcache.max_streams.
 *
 * DROP ROLE of a stream's owner, in projcache.database, is refused
 * (pc_stream_of_owner(), which keycache_role_guard.c's guard asks):
 * create_stream holds a lock on its owner until it commits, and the guard
 * takes the lock DROP ROLE takes on the role before it reads the registry.
 *
 * Each stream runs in a worker of its own (stream_worker.c), which reads
 * its row here (pc_stream_read()); the scheduler lists the rows to start
 * and stop the workers (pc_stream_list()), and a commit that creates,
 * changes or drops a stream has it do so at once (pc_streams_changed()).
 * projcache.streams shows each stream's run-time state from its worker's
 * slot.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/htup_details.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/pg_lsn.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "keycache_caches.h"
#include "projcache.h"
#include "shmem.h"
#include "stream_conninfo.h"
#include "stream_registry.h"
#include "stream_worker.h"
#include "user_switch.h"

PG_FUNCTION_INFO_V1(projcache_create_stream);
PG_FUNCTION_INFO_V1(projcache_alter_stream);
PG_FUNCTION_INFO_V1(projcache_stream_table);
PG_FUNCTION_INFO_V1(projcache_stream_snapshot);
PG_FUNCTION_INFO_V1(projcache_unstream_table);
PG_FUNCTION_INFO_V1(projcache_drop_stream);
PG_FUNCTION_INFO_V1(projcache_streams);
PG_FUNCTION_INFO_V1(projcache_stream_mappings);

/* The mappings one stream may have. */
#define PC_MAX_STREAM_MAPPINGS	256

/* The columns of projcache.streams and projcache.stream_mappings. */
#define STREAMS_COLS			20
#define STREAM_MAPPINGS_COLS	8

/* ----------------------------------------------------------------
 * The registry's statements
 * ----------------------------------------------------------------
 */

/*
 * The registry is projcache.database's tables: refuse to run elsewhere,
 * where tables of those names are not what the streams' workers read.
 */
static void
check_stream_database(void)
{
	pc_require_loaded();
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("streams are changed on the primary"),
				 errdetail("A standby reads the registry its primary wrote.")));
	if (pc_database == NULL ||
		strcmp(get_database_name(MyDatabaseId), pc_database) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("streams are registered in database \"%s\"",
						pc_database ? pc_database : ""),
				 errdetail("The streams' workers read the registry of the database projcache.database names only."),
				 errhint("Connect to database \"%s\" to register, change or drop a stream.",
						 pc_database ? pc_database : "")));
}

/*
 * What counts rows against a bound, create_stream (projcache.max_streams
 * and a role's half) and stream_table and stream_snapshot (a stream's
 * mappings), counts them once it holds the lock that makes the count
 * and its insert one: under a transaction snapshot taken before the lock
 * (REPEATABLE READ, SERIALIZABLE) it would not see the rows of the
 * transaction it waited for, and two of them could both take the last
 * place.  The other functions change one stream's row, locked FOR UPDATE,
 * which such a snapshot takes as well (a serialization failure if the row
 * changed since).
 */
static void
check_read_committed(const char *what)
{
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("%s runs in READ COMMITTED transactions only", what),
				 errdetail("Its bound is checked against what is committed when its lock is taken.")));
}

/* Statements on the registry: as the bootstrap superuser, in SPI. */
static void
stream_begin(PcUserSwitch *rs)
{
	pc_become_extension(rs);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
stream_end(PcUserSwitch *rs)
{
	SPI_finish();
	pc_unbecome(rs);
}

/* Run one statement; an ERROR unless SPI answers 'expect'. */
static void
stream_exec(const char *sql, int nargs, Oid *argtypes, Datum *args,
			const char *nulls, int expect)
{
	int			ret = SPI_execute_with_args(sql, nargs, argtypes, args, nulls,
											false, 0);

	if (ret != expect)
		elog(ERROR, "could not run a statement on the stream registry: %s",
			 SPI_result_code_string(ret));
}

/* A column of the current SPI row as a string of the caller's memory. */
static char *
spi_string(int row, int col)
{
	char	   *v = SPI_getvalue(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
								 col);
	char	   *copy;

	if (v == NULL)
		return NULL;
	copy = SPI_palloc(strlen(v) + 1);
	strcpy(copy, v);
	return copy;
}

static Datum
spi_datum(int row, int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col,
						 isnull);
}

/*
 * The registry's totals are locked against other creations until the end
 * of the transaction.  Not the table: a lock on it would make every
 * change wait for any open transaction that changed any stream.  The lock
 * is an object lock on the registry's OID that nothing else takes.
 */
static void
lock_stream_totals(void)
{
	Oid			nsp = get_namespace_oid("projcache", false);
	Oid			relid = get_relname_relid("stream_registry", nsp);

	if (!OidIsValid(relid))
		elog(ERROR, "projcache.stream_registry does not exist");
	LockDatabaseObject(RelationRelationId, relid, 0, ExclusiveLock);
}

/* What a change needs of a registered stream. */
typedef struct StreamRow
{
	int64		id;
	Oid			owner;
	char	   *conninfo;
} StreamRow;

/*
 * The row of a stream; an ERROR (42704) if there is none.  With lock, the
 * row is locked (FOR UPDATE) until the end of the transaction, and read as
 * its latest version.
 */
static void
read_stream_row(const char *name, StreamRow *row, bool lock)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	bool		isnull;
	PcUserSwitch rs;

	stream_begin(&rs);
	stream_exec(lock ?
				"SELECT id, owner::pg_catalog.oid, conninfo"
				" FROM projcache.stream_registry"
				" WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE" :
				"SELECT id, owner::pg_catalog.oid, conninfo"
				" FROM projcache.stream_registry"
				" WHERE name OPERATOR(pg_catalog.=) $1",
				1, argtypes, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
	{
		stream_end(&rs);
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" does not exist", name)));
	}
	row->id = DatumGetInt64(spi_datum(0, 1, &isnull));
	row->owner = DatumGetObjectId(spi_datum(0, 2, &isnull));
	row->conninfo = spi_string(0, 3);
	stream_end(&rs);
}

/* The caller must have the privileges of the stream's owner. */
static void
check_stream_owner(const char *name, const StreamRow *row)
{
	if (!has_privs_of_role(GetUserId(), row->owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of stream \"%s\"", name)));
}

/*
 * The row of a stream the caller must own, locked for the change.  The
 * owner is checked before the row is locked, so that a role that does not
 * own the stream never holds its lock, and again on the locked row, its
 * latest version.
 */
static void
lock_owned_stream_row(const char *name, StreamRow *row)
{
	read_stream_row(name, row, false);
	check_stream_owner(name, row);
	read_stream_row(name, row, true);
	check_stream_owner(name, row);
}

/* ----------------------------------------------------------------
 * Checks of the arguments
 * ----------------------------------------------------------------
 */

/* A stream's name: as a cache's, [a-z][a-z0-9_]*, at most 63 bytes. */
static void
check_stream_name(const char *name)
{
	size_t		len = strlen(name);

	if (len >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream name is %zu bytes long, longer than %d", len,
						NAMEDATALEN - 1)));
	if (!pc_registry_name_ok(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid stream name \"%s\"", name),
				 errdetail("A stream's name is a lower-case letter, then lower-case letters, digits and underscores, at most %d bytes.",
						   NAMEDATALEN - 1)));
}

/*
 * A name as SQL writes it (unquoted: folded to lower case; "quoted": as
 * it is), of parts separated by dots: the names, as the source's catalogs
 * have them.  An ERROR (42602) if it is no such name.
 */
static List *
parse_names(const char *text)
{
	return pc_string_to_qualified_name_list(text);
}

/* A publication's name: one SQL identifier. */
static char *
check_publication(const char *text)
{
	List	   *names = parse_names(text);

	if (list_length(names) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid publication name \"%s\"", text),
				 errdetail("A publication's name is one identifier, quoted as SQL quotes it if need be.")));
	return strVal(linitial(names));
}

/* A key column's name: one SQL identifier. */
static char *
check_key_column(const char *text)
{
	List	   *names = parse_names(text);

	if (list_length(names) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid key column name \"%s\"", text),
				 errdetail("A key column's name is one identifier, quoted as SQL quotes it if need be.")));
	return strVal(linitial(names));
}

/*
 * A mapping's source table: its schema's name and its own, as the
 * source's catalogs have them (kept as two columns of type name, so that
 * one table is one table whatever a session's settings), and how the
 * views and the messages show it.
 */
typedef struct SourceTable
{
	char	   *schema;
	char	   *table;
	char	   *shown;			/* source_table_text() */
} SourceTable;

/*
 * schema.table, each name quoted as quote_identifier() quotes it with
 * quote_all_identifiers off (whatever the session's setting): as the
 * views show a mapping's table, and as stream_table reads it back.
 */
static char *
source_table_text(const char *schema, const char *table)
{
	bool		quote_all = quote_all_identifiers;
	char	   *shown;

	quote_all_identifiers = false;
	shown = psprintf("%s.%s", quote_identifier(schema),
					 quote_identifier(table));
	quote_all_identifiers = quote_all;
	return shown;
}

/* A source table: schema.table, as SQL writes it. */
static void
check_source_table(const char *text, SourceTable *source)
{
	List	   *names = parse_names(text);

	if (list_length(names) != 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("source table \"%s\" is not schema.table", text),
				 errdetail("A stream's table is named with its schema on the source, which has its own search_path."),
				 errhint("Write the table as schema.table, for example public.accounts.")));
	source->schema = strVal(linitial(names));
	source->table = strVal(lsecond(names));
	source->shown = source_table_text(source->schema, source->table);
}

/*
 * A slot's name, as the source's ReplicationSlotValidateName() takes it:
 * lower-case letters, digits and underscores, at most NAMEDATALEN - 1
 * bytes.
 */
static void
check_slot_name(const char *name)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("replication slot name \"%s\" is too short", name)));
	if (len >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("replication slot name \"%s\" is too long", name)));
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
			  *p == '_'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_NAME),
					 errmsg("replication slot name \"%s\" contains invalid character",
							name),
					 errhint("Replication slot names may only contain lower case letters, numbers, and the underscore character.")));
}

/* A text argument that must be given, as a C string. */
static char *
required_arg(FunctionCallInfo fcinfo, int n, const char *what)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return text_to_cstring(PG_GETARG_TEXT_PP(n));
}

/* ----------------------------------------------------------------
 * Streams
 * ----------------------------------------------------------------
 */

/* projcache.create_stream(name, conninfo, publication, slot_name) */
Datum
projcache_create_stream(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *conninfo;
	char	   *publication;
	char	   *slot_name = NULL;
	bool		super = superuser();
	int			count;
	int			owner_count;
	int			half = pc_max_streams / 2;
	bool		inserted;
	Oid			argtypes[5] = {TEXTOID, OIDOID, TEXTOID, TEXTOID, TEXTOID};
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	PcUserSwitch rs;
	bool		isnull;

	check_stream_database();
	check_read_committed("create_stream");
	name = required_arg(fcinfo, 0, "a stream's name");
	conninfo = required_arg(fcinfo, 1, "a stream's connection string");
	publication = required_arg(fcinfo, 2, "a stream's publication");
	check_stream_name(name);
	if (GetUserId() == ROLE_PG_DATABASE_OWNER)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("role \"pg_database_owner\" cannot own a stream")));
	pc_stream_check_conninfo(name, conninfo, !super);
	publication = check_publication(publication);
	if (!PG_ARGISNULL(3))
	{
		slot_name = text_to_cstring(PG_GETARG_TEXT_PP(3));
		check_slot_name(slot_name);
	}

	/*
	 * A DROP ROLE of the owner waits for this transaction, then sees it.  A
	 * DROP ROLE that holds the lock already is waited for: once it commits,
	 * the role is gone (taking the lock has read the invalidations), as
	 * shdepLockAndCheckObject() finds.
	 */
	LockSharedObject(AuthIdRelationId, GetUserId(), 0, AccessShareLock);
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(GetUserId())))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role %u was concurrently dropped", GetUserId())));

	lock_stream_totals();
	args[0] = ObjectIdGetDatum(GetUserId());
	stream_begin(&rs);
	stream_exec("SELECT pg_catalog.count(*),"
				" pg_catalog.count(*) FILTER (WHERE owner::pg_catalog.oid"
				" OPERATOR(pg_catalog.=) $1)"
				" FROM projcache.stream_registry",
				1, argtypes + 1, args, NULL, SPI_OK_SELECT);
	count = (int) DatumGetInt64(spi_datum(0, 1, &isnull));
	owner_count = (int) DatumGetInt64(spi_datum(0, 2, &isnull));
	stream_end(&rs);

	if (count >= pc_max_streams)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot register more than %d streams", pc_max_streams),
				 errhint("Drop a stream, or raise projcache.max_streams (a change of it takes a restart).")));
	if (!super && owner_count >= half)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("role \"%s\" owns %d streams, the most one role may",
						GetUserNameFromId(GetUserId(), false), half),
				 errdetail("A role that is not a superuser may own at most half of projcache.max_streams (%d), rounded down.",
						   pc_max_streams)));

	args[0] = CStringGetTextDatum(name);
	args[1] = ObjectIdGetDatum(GetUserId());
	args[2] = CStringGetTextDatum(conninfo);
	args[3] = CStringGetTextDatum(publication);
	args[4] = slot_name ? CStringGetTextDatum(slot_name) : (Datum) 0;
	nulls[4] = slot_name ? ' ' : 'n';
	stream_begin(&rs);
	stream_exec("INSERT INTO projcache.stream_registry"
				" (name, owner, conninfo, publication, slot_name)"
				" VALUES ($1, $2::pg_catalog.regrole, $3, $4, $5)"
				" ON CONFLICT (name) DO NOTHING",
				5, argtypes, args, nulls, SPI_OK_INSERT);
	inserted = SPI_processed > 0;
	stream_end(&rs);
	pc_streams_changed();
	if (!inserted)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" already exists", name)));
	PG_RETURN_VOID();
}

/*
 * projcache.alter_stream(name, conninfo, publication): a NULL argument
 * keeps what the stream has.  The connection string the stream ends with
 * (the new one, or the one it keeps) is checked for its owner as at
 * creation, and for the caller: a superuser who changes another role's
 * stream keeps a password in it, and an owner who is no longer a
 * superuser gives one before changing anything else.
 */
Datum
projcache_alter_stream(PG_FUNCTION_ARGS)
{
	char	   *name;
	StreamRow	row;
	Oid			argtypes[3] = {INT8OID, TEXTOID, TEXTOID};
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	char	   *conninfo = NULL;
	char	   *publication = NULL;
	PcUserSwitch rs;

	check_stream_database();
	name = required_arg(fcinfo, 0, "the name of the stream to change");
	check_stream_name(name);
	lock_owned_stream_row(name, &row);
	if (!PG_ARGISNULL(1))
		conninfo = text_to_cstring(PG_GETARG_TEXT_PP(1));
	pc_stream_check_conninfo(name, conninfo ? conninfo : row.conninfo,
							 !superuser() || !superuser_arg(row.owner));
	if (!PG_ARGISNULL(2))
		publication = check_publication(text_to_cstring(PG_GETARG_TEXT_PP(2)));

	args[0] = Int64GetDatum(row.id);
	args[1] = conninfo ? CStringGetTextDatum(conninfo) : (Datum) 0;
	nulls[1] = conninfo ? ' ' : 'n';
	args[2] = publication ? CStringGetTextDatum(publication) : (Datum) 0;
	nulls[2] = publication ? ' ' : 'n';
	stream_begin(&rs);
	stream_exec("UPDATE projcache.stream_registry SET"
				" conninfo = COALESCE($2, conninfo),"
				" publication = COALESCE($3, publication)"
				" WHERE id OPERATOR(pg_catalog.=) $1",
				3, argtypes, args, nulls, SPI_OK_UPDATE);
	stream_end(&rs);
	pc_streams_changed();
	PG_RETURN_VOID();
}

/* projcache.drop_stream(name): its mappings go with it (ON DELETE CASCADE). */
Datum
projcache_drop_stream(PG_FUNCTION_ARGS)
{
	char	   *name;
	StreamRow	row;
	Oid			argtypes[1] = {INT8OID};
	Datum		args[1];
	PcUserSwitch rs;

	check_stream_database();
	name = required_arg(fcinfo, 0, "the name of the stream to drop");
	check_stream_name(name);
	lock_owned_stream_row(name, &row);
	args[0] = Int64GetDatum(row.id);
	stream_begin(&rs);
	stream_exec("DELETE FROM projcache.stream_registry"
				" WHERE id OPERATOR(pg_catalog.=) $1",
				1, argtypes, args, NULL, SPI_OK_DELETE);
	stream_end(&rs);
	pc_streams_changed();
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * Mappings
 * ----------------------------------------------------------------
 */

/* A mapping's target, by identity. */
typedef struct MappingTarget
{
	const char *cache;			/* a named cache, or NULL */
	TimestampTz cache_created_at;
	int64		snapshot;		/* a snapshot's id, or 0 */
} MappingTarget;

/*
 * A registry row a mapping targets, which the caller must own: the value
 * of its identity column (a cache's created_at, a snapshot's id), read by
 * the query 'find' (its owner's OID, then that column, of the row named
 * $1), which 'lock' is with FOR KEY SHARE.  The owner is checked first,
 * then the row locked and checked again, so that another role's row is
 * never locked and the row is not dropped before this transaction ends.
 * what: "cache" or "snapshot", for the errors.  Both identity columns are
 * 64-bit integers (timestamptz is one), read before SPI's memory goes.
 */
static int64
owned_target(const char *what, const char *find, const char *lock,
			 const char *name)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1] = {CStringGetTextDatum(name)};
	int64		identity = 0;
	PcUserSwitch rs;

	for (int pass = 0; pass < 2; pass++)
	{
		bool		isnull;
		Oid			owner = InvalidOid;
		bool		found;

		stream_begin(&rs);
		stream_exec(pass == 0 ? find : lock, 1, argtypes, args, NULL,
					SPI_OK_SELECT);
		found = SPI_processed > 0;
		if (found)
		{
			owner = DatumGetObjectId(spi_datum(0, 1, &isnull));
			identity = DatumGetInt64(spi_datum(0, 2, &isnull));
		}
		stream_end(&rs);
		if (!found)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("%s \"%s\" does not exist", what, name)));
		if (!has_privs_of_role(GetUserId(), owner))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("must be owner of %s \"%s\"", what, name)));
	}
	return identity;
}

#define OWNED_CACHE_SQL \
	"SELECT owner::pg_catalog.oid, created_at" \
	" FROM projcache.cache_registry" \
	" WHERE name OPERATOR(pg_catalog.=) $1"
#define OWNED_SNAPSHOT_SQL \
	"SELECT owner::pg_catalog.oid, id" \
	" FROM projcache.snapshot_registry" \
	" WHERE name OPERATOR(pg_catalog.=) $1"

/* The created_at of a named cache the caller must own (owned_target()). */
static TimestampTz
owned_cache(const char *cache)
{
	return (TimestampTz) owned_target("cache", OWNED_CACHE_SQL,
									  OWNED_CACHE_SQL " FOR KEY SHARE", cache);
}

/* The id of a snapshot the caller must own (owned_target()). */
static int64
owned_snapshot(const char *snapshot)
{
	return owned_target("snapshot", OWNED_SNAPSHOT_SQL,
						OWNED_SNAPSHOT_SQL " FOR KEY SHARE", snapshot);
}

/*
 * Add a mapping of the stream's table: to keys (key_column, key_prefix)
 * of a cache, or to a snapshot.  The stream's row is locked already.
 */
static void
add_mapping(const char *stream, const StreamRow *row,
			const SourceTable *table,
			const char *key_column, const char *key_prefix,
			const MappingTarget *target)
{
	Oid			argtypes[8] = {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID,
	TIMESTAMPTZOID, TEXTOID, INT8OID};
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	PcUserSwitch rs;
	bool		isnull;
	int64		n;
	bool		inserted;

	args[0] = Int64GetDatum(row->id);
	stream_begin(&rs);
	stream_exec("SELECT pg_catalog.count(*)"
				" FROM projcache.stream_mapping_registry"
				" WHERE stream_id OPERATOR(pg_catalog.=) $1",
				1, argtypes, args, NULL, SPI_OK_SELECT);
	n = DatumGetInt64(spi_datum(0, 1, &isnull));
	stream_end(&rs);
	if (n >= PC_MAX_STREAM_MAPPINGS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("stream \"%s\" has %d mappings, the most a stream may have",
						stream, PC_MAX_STREAM_MAPPINGS)));

	args[1] = CStringGetTextDatum(table->schema);
	args[2] = CStringGetTextDatum(table->table);
	args[3] = key_column ? CStringGetTextDatum(key_column) : (Datum) 0;
	nulls[3] = key_column ? ' ' : 'n';
	args[4] = target->cache ? CStringGetTextDatum(target->cache) : (Datum) 0;
	nulls[4] = target->cache ? ' ' : 'n';
	args[5] = TimestampTzGetDatum(target->cache_created_at);
	nulls[5] = target->cache ? ' ' : 'n';
	args[6] = key_prefix ? CStringGetTextDatum(key_prefix) : (Datum) 0;
	nulls[6] = key_prefix ? ' ' : 'n';
	args[7] = Int64GetDatum(target->snapshot);
	nulls[7] = target->snapshot != 0 ? ' ' : 'n';
	stream_begin(&rs);
	stream_exec("INSERT INTO projcache.stream_mapping_registry"
				" (stream_id, source_schema, source_table_name, key_column,"
				" cache_name, cache_created_at, key_prefix, snapshot_id)"
				" VALUES ($1, $2::pg_catalog.name, $3::pg_catalog.name, $4, $5,"
				" $6, $7, $8)"
				" ON CONFLICT DO NOTHING",
				8, argtypes, args, nulls, SPI_OK_INSERT);
	inserted = SPI_processed > 0;
	stream_end(&rs);
	if (inserted)
		return;
	if (target->snapshot != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" maps table %s to this snapshot already",
						stream, table->shown)));
	if (target->cache != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" maps table %s to cache \"%s\" already",
						stream, table->shown, target->cache)));
	ereport(ERROR,
			(errcode(ERRCODE_DUPLICATE_OBJECT),
			 errmsg("stream \"%s\" maps table %s to the default cache already",
					stream, table->shown)));
}

/*
 * projcache.stream_table(stream, source_table, key_column, cache,
 *	 key_prefix): a change to a row of the table invalidates key
 *	 key_prefix || key_column of the cache (NULL: the default cache,
 *	 superuser only).
 */
Datum
projcache_stream_table(PG_FUNCTION_ARGS)
{
	char	   *stream;
	char	   *table;
	char	   *key_column;
	char	   *key_prefix;
	SourceTable source;
	MappingTarget target = {0};
	StreamRow	row;
	size_t		key_room;

	check_stream_database();
	check_read_committed("stream_table");
	stream = required_arg(fcinfo, 0, "a mapping's stream");
	table = required_arg(fcinfo, 1, "a mapping's source table");
	key_column = required_arg(fcinfo, 2, "a mapping's key column");
	key_prefix = required_arg(fcinfo, 4, "a mapping's key prefix");
	check_stream_name(stream);
	lock_owned_stream_row(stream, &row);
	check_source_table(table, &source);
	key_column = check_key_column(key_column);
	/* "default", the name the views show, is the default cache's too */
	if (PG_ARGISNULL(3) ||
		strcmp(text_to_cstring(PG_GETARG_TEXT_PP(3)),
			   PC_DEFAULT_CACHE_NAME) == 0)
	{
		if (!superuser())
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("only a superuser may map a table to the default cache"),
					 errhint("Name a cache of your own.")));
	}
	else
	{
		target.cache = text_to_cstring(PG_GETARG_TEXT_PP(3));
		target.cache_created_at = owned_cache(target.cache);
	}

	/* A full key is "cache:" (a named cache's), the prefix, then the key. */
	key_room = strlen(key_prefix) + (target.cache ? strlen(target.cache) + 1 : 0);
	if (key_room >= PC_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key prefix is %zu bytes long, too long for keys of at most %d bytes",
						strlen(key_prefix), PC_MAX_KEY_BYTES),
				 errdetail("A key is the prefix, then the key column's value, after \"name:\" for a named cache.")));
	add_mapping(stream, &row, &source, key_column, key_prefix, &target);
	PG_RETURN_VOID();
}

/*
 * projcache.stream_snapshot(stream, source_table, snapshot): a change to
 * the table refreshes the snapshot.
 */
Datum
projcache_stream_snapshot(PG_FUNCTION_ARGS)
{
	char	   *stream;
	char	   *table;
	char	   *snapshot;
	SourceTable source;
	MappingTarget target = {0};
	StreamRow	row;

	check_stream_database();
	check_read_committed("stream_snapshot");
	stream = required_arg(fcinfo, 0, "a mapping's stream");
	table = required_arg(fcinfo, 1, "a mapping's source table");
	snapshot = required_arg(fcinfo, 2, "a mapping's snapshot");
	check_stream_name(stream);
	lock_owned_stream_row(stream, &row);
	check_source_table(table, &source);
	target.snapshot = owned_snapshot(snapshot);
	add_mapping(stream, &row, &source, NULL, NULL, &target);
	PG_RETURN_VOID();
}

/*
 * projcache.unstream_table(stream, source_table, cache, snapshot): remove
 * the mapping of the table to the cache (NULL: the default cache) or to
 * the snapshot.  The owner of the stream may remove any of its mappings.
 */
Datum
projcache_unstream_table(PG_FUNCTION_ARGS)
{
	char	   *stream;
	char	   *table;
	char	   *cache = NULL;
	char	   *snapshot = NULL;
	SourceTable source;
	StreamRow	row;
	Oid			argtypes[4] = {INT8OID, TEXTOID, TEXTOID, TEXTOID};
	Datum		args[4];
	PcUserSwitch rs;
	bool		deleted;

	check_stream_database();
	stream = required_arg(fcinfo, 0, "a mapping's stream");
	table = required_arg(fcinfo, 1, "a mapping's source table");
	if (!PG_ARGISNULL(2))
		cache = text_to_cstring(PG_GETARG_TEXT_PP(2));
	/* "default", which no named cache is called, is the default cache */
	if (cache != NULL && strcmp(cache, PC_DEFAULT_CACHE_NAME) == 0)
		cache = NULL;
	if (!PG_ARGISNULL(3))
		snapshot = text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (cache != NULL && snapshot != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a mapping is to a cache or to a snapshot, not both"),
				 errhint("Remove each mapping by a call of its own.")));
	check_stream_name(stream);
	lock_owned_stream_row(stream, &row);
	check_source_table(table, &source);

	args[0] = Int64GetDatum(row.id);
	args[1] = CStringGetTextDatum(source.schema);
	args[2] = CStringGetTextDatum(source.table);
	args[3] = CStringGetTextDatum(snapshot ? snapshot : cache ? cache : "");
	stream_begin(&rs);
	if (snapshot != NULL)
		stream_exec("DELETE FROM projcache.stream_mapping_registry m"
					" USING projcache.snapshot_registry s"
					" WHERE m.stream_id OPERATOR(pg_catalog.=) $1"
					" AND m.source_schema OPERATOR(pg_catalog.=) $2::pg_catalog.name"
					" AND m.source_table_name OPERATOR(pg_catalog.=) $3::pg_catalog.name"
					" AND m.snapshot_id OPERATOR(pg_catalog.=) s.id"
					" AND s.name OPERATOR(pg_catalog.=) $4",
					4, argtypes, args, NULL, SPI_OK_DELETE);
	else if (cache != NULL)
		stream_exec("DELETE FROM projcache.stream_mapping_registry"
					" WHERE stream_id OPERATOR(pg_catalog.=) $1"
					" AND source_schema OPERATOR(pg_catalog.=) $2::pg_catalog.name"
					" AND source_table_name OPERATOR(pg_catalog.=) $3::pg_catalog.name"
					" AND cache_name OPERATOR(pg_catalog.=) $4",
					4, argtypes, args, NULL, SPI_OK_DELETE);
	else
		stream_exec("DELETE FROM projcache.stream_mapping_registry"
					" WHERE stream_id OPERATOR(pg_catalog.=) $1"
					" AND source_schema OPERATOR(pg_catalog.=) $2::pg_catalog.name"
					" AND source_table_name OPERATOR(pg_catalog.=) $3::pg_catalog.name"
					" AND cache_name IS NULL AND snapshot_id IS NULL",
					3, argtypes, args, NULL, SPI_OK_DELETE);
	deleted = SPI_processed > 0;
	stream_end(&rs);
	if (deleted)
		PG_RETURN_VOID();
	if (snapshot != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" maps table %s to no snapshot \"%s\"",
						stream, source.shown, snapshot)));
	if (cache != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" maps table %s to no cache \"%s\"",
						stream, source.shown, cache)));
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("stream \"%s\" does not map table %s to the default cache",
					stream, source.shown)));
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * The views
 * ----------------------------------------------------------------
 */

/*
 * projcache.streams_1_4(): the streams whose owner's privileges the
 * caller has (a superuser: every stream), with the connection string
 * without its password to the owner itself and to superusers (NULL to a
 * member of the owner role), and each stream's run-time state from its
 * worker's slot (stream_worker.c), to the same roles (NULL to a member:
 * its last error may name the source's hosts).  A stream with no slot
 * yet is "starting" ("standby" on a standby, where no worker runs).
 */
Datum
projcache_streams(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			me = GetUserId();
	bool		standby = RecoveryInProgress();
	PcUserSwitch rs;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != STREAMS_COLS)
		elog(ERROR, "projcache.streams has %d columns, not %d",
			 rsinfo->setDesc->natts, STREAMS_COLS);

	stream_begin(&rs);
	stream_exec("SELECT name, owner::pg_catalog.oid, conninfo, publication,"
				" slot_name, id FROM projcache.stream_registry ORDER BY name",
				0, NULL, NULL, NULL, SPI_OK_SELECT);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		values[STREAMS_COLS];
		bool		nulls[STREAMS_COLS];
		bool		isnull;
		Oid			owner = DatumGetObjectId(spi_datum(r, 2, &isnull));
		int64		id = DatumGetInt64(spi_datum(r, 6, &isnull));
		PcStreamRuntime rt;
		char	   *shown;
		int			col = 0;

		if (!has_privs_of_role(me, owner))
			continue;
		if (!pc_stream_runtime(id, &rt))
		{
			memset(&rt, 0, sizeof(rt));
			rt.state = standby ? PC_STREAM_STANDBY : PC_STREAM_STARTING;
		}
		else if (standby)
			rt.state = PC_STREAM_STANDBY;
		memset(nulls, true, sizeof(nulls));
		values[col] = spi_datum(r, 1, &nulls[col]);
		col++;
		values[col] = ObjectIdGetDatum(owner);
		nulls[col++] = false;
		/* the connection string: to its owner and superusers only */
		shown = me != owner && !superuser_arg(me) ? NULL :
			pc_stream_conninfo_shown(SPI_getvalue(SPI_tuptable->vals[r],
												  SPI_tuptable->tupdesc, 3));
		if (shown != NULL)
		{
			values[col] = CStringGetTextDatum(shown);
			nulls[col] = false;
		}
		col++;
		values[col] = spi_datum(r, 4, &nulls[col]);
		col++;
		values[col] = spi_datum(r, 5, &nulls[col]);
		col++;
		/* the run-time state: to the owner and superusers only, too */
		if (me != owner && !superuser_arg(me))
		{
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
								 nulls);
			continue;
		}
		values[col] = CStringGetTextDatum(pc_stream_state_name(rt.state));
		nulls[col++] = false;
		if (rt.system_id != 0)
		{
			values[col] = Int64GetDatum((int64) rt.system_id);
			nulls[col] = false;
			values[col + 1] = Int32GetDatum((int32) rt.timeline);
			nulls[col + 1] = false;
		}
		col += 2;
		if (!XLogRecPtrIsInvalid(rt.received_lsn))
		{
			values[col] = LSNGetDatum(rt.received_lsn);
			nulls[col] = false;
		}
		col++;
		if (!XLogRecPtrIsInvalid(rt.confirmed_lsn))
		{
			values[col] = LSNGetDatum(rt.confirmed_lsn);
			nulls[col] = false;
		}
		col++;
		/* lag, last_commit_at: not known until changes are applied */
		col += 2;
		values[col] = Int64GetDatum(rt.transactions);
		nulls[col++] = false;
		values[col] = Int64GetDatum(rt.changes);
		nulls[col++] = false;
		values[col] = Int64GetDatum(rt.keys_invalidated);
		nulls[col++] = false;
		values[col] = Int64GetDatum(rt.snapshots_refreshed);
		nulls[col++] = false;
		values[col] = Int64GetDatum(rt.full_refetches);
		nulls[col++] = false;
		values[col] = Int64GetDatum(rt.reconnects);
		nulls[col++] = false;
		if (rt.last_error[0] != '\0')
		{
			values[col] = CStringGetTextDatum(rt.last_error);
			nulls[col] = false;
			values[col + 1] = TimestampTzGetDatum(rt.last_error_at);
			nulls[col + 1] = false;
		}
		col += 2;
		Assert(col == STREAMS_COLS);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	stream_end(&rs);
	return (Datum) 0;
}

/*
 * projcache.stream_mappings_1_4(): the mappings of the streams the caller
 * sees in projcache.streams.  cache is a named cache's name, "default"
 * for the default cache, NULL for a snapshot's mapping.
 */
Datum
projcache_stream_mappings(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			me = GetUserId();
	PcUserSwitch rs;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != STREAM_MAPPINGS_COLS)
		elog(ERROR, "projcache.stream_mappings has %d columns, not %d",
			 rsinfo->setDesc->natts, STREAM_MAPPINGS_COLS);

	stream_begin(&rs);
	stream_exec("SELECT s.name, m.source_schema, m.source_table_name,"
				" m.key_column,"
				" CASE WHEN m.snapshot_id IS NULL THEN"
				" COALESCE(m.cache_name, 'default') END,"
				" m.key_prefix, n.name, s.owner::pg_catalog.oid"
				" FROM projcache.stream_mapping_registry m"
				" JOIN projcache.stream_registry s"
				" ON s.id OPERATOR(pg_catalog.=) m.stream_id"
				" LEFT JOIN projcache.snapshot_registry n"
				" ON n.id OPERATOR(pg_catalog.=) m.snapshot_id"
				" ORDER BY s.name, m.source_schema, m.source_table_name,"
				" m.cache_name NULLS FIRST,"
				" n.name NULLS FIRST",
				0, NULL, NULL, NULL, SPI_OK_SELECT);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		values[STREAM_MAPPINGS_COLS];
		bool		nulls[STREAM_MAPPINGS_COLS];
		bool		isnull;
		Oid			owner = DatumGetObjectId(spi_datum(r, 8, &isnull));

		if (!has_privs_of_role(me, owner))
			continue;
		values[0] = spi_datum(r, 1, &nulls[0]);
		values[1] = CStringGetTextDatum(source_table_text(SPI_getvalue(SPI_tuptable->vals[r],
																	   SPI_tuptable->tupdesc, 2),
														  SPI_getvalue(SPI_tuptable->vals[r],
																	   SPI_tuptable->tupdesc, 3)));
		nulls[1] = false;
		for (int c = 2; c < 6; c++)
			values[c] = spi_datum(r, c + 2, &nulls[c]);
		values[6] = CStringGetTextDatum("ok");
		nulls[6] = false;
		values[7] = (Datum) 0;
		nulls[7] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values,
							 nulls);
	}
	stream_end(&rs);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * DROP ROLE's guard
 * ----------------------------------------------------------------
 */

/* The streams' registry of this database, if it is projcache's own. */
static Oid
stream_registry_relid(void)
{
	return pc_extension_table("stream_registry");
}

/*
 * The name of a stream the role owns, in the registry as the latest
 * snapshot has it (this transaction's changes included), or NULL: none, or
 * this is not projcache.database, or it has no registry of ours.  For the
 * guard that refuses DROP ROLE of a stream's owner, which holds the lock
 * on the role that create_stream takes.
 */
char *
pc_stream_of_owner(Oid role)
{
	Oid			argtypes[1] = {OIDOID};
	Datum		args[1] = {ObjectIdGetDatum(role)};
	PcUserSwitch rs;
	SPIPlanPtr	plan;
	char	   *name = NULL;

	if (pc_database == NULL || IsInParallelMode() ||
		strcmp(get_database_name(MyDatabaseId), pc_database) != 0 ||
		!OidIsValid(stream_registry_relid()))
		return NULL;
	stream_begin(&rs);
	plan = SPI_prepare("SELECT name FROM projcache.stream_registry"
					   " WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) $1"
					   " ORDER BY name LIMIT 1",
					   1, argtypes);
	if (plan == NULL ||
		SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(),
							 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read projcache.stream_registry");
	if (SPI_processed > 0)
		name = spi_string(0, 1);
	stream_end(&rs);
	return name;
}

/* ----------------------------------------------------------------
 * The workers' reads
 * ----------------------------------------------------------------
 */

/*
 * The registered streams (at most max), for the scheduler, which starts
 * their workers; 0 if this database has no registry of ours.  In a
 * transaction with a snapshot.
 */
int
pc_stream_list(PcStreamListed *out, int max)
{
	PcUserSwitch rs;
	int			n = 0;

	if (!OidIsValid(stream_registry_relid()))
		return 0;
	stream_begin(&rs);
	stream_exec("SELECT id, name, xmin::pg_catalog.text::pg_catalog.int8"
				" FROM projcache.stream_registry ORDER BY id",
				0, NULL, NULL, NULL, SPI_OK_SELECT);
	for (uint64 r = 0; r < SPI_processed && n < max; r++)
	{
		bool		isnull;
		char	   *name = SPI_getvalue(SPI_tuptable->vals[r],
										SPI_tuptable->tupdesc, 2);

		out[n].id = DatumGetInt64(spi_datum(r, 1, &isnull));
		strlcpy(out[n].name, name, NAMEDATALEN);
		out[n].xmin = (TransactionId) DatumGetInt64(spi_datum(r, 3, &isnull));
		n++;
	}
	stream_end(&rs);
	return n;
}

/*
 * A stream's row, for its worker, copied into TopMemoryContext; false if
 * it is gone or this database has no registry of ours.  In a transaction
 * with a snapshot.
 */
bool
pc_stream_read(int64 id, PcStreamDef *def)
{
	Oid			argtypes[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(id)};
	PcUserSwitch rs;
	bool		found = false;

	if (!OidIsValid(stream_registry_relid()))
		return false;
	stream_begin(&rs);
	stream_exec("SELECT name, owner::pg_catalog.oid, conninfo, publication,"
				" slot_name, xmin::pg_catalog.text::pg_catalog.int8"
				" FROM projcache.stream_registry"
				" WHERE id OPERATOR(pg_catalog.=) $1",
				1, argtypes, args, NULL, SPI_OK_SELECT);
	if (SPI_processed > 0)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *slot = SPI_getvalue(tup, desc, 5);

		def->id = id;
		def->name = pstrdup(SPI_getvalue(tup, desc, 1));
		def->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
		def->conninfo = pstrdup(SPI_getvalue(tup, desc, 3));
		def->publication = pstrdup(SPI_getvalue(tup, desc, 4));
		def->slot_name = slot ? pstrdup(slot) : NULL;
		def->xmin = (TransactionId)
			DatumGetInt64(SPI_getbinval(tup, desc, 6, &isnull));
		MemoryContextSwitchTo(old);
		found = true;
	}
	stream_end(&rs);
	return found;
}
