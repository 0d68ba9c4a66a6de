/*-------------------------------------------------------------------------
 *
 * stream_conninfo.c
 *	  A change stream's connection string: what it may and must hold, and
 *	  what projcache.streams shows of it.
 *
 * The string is parsed by the libpq projcache is linked with, as the
 * stream's worker will parse it, and judged by what that libpq says of
 * each option (its dispchar), so that the options of a later libpq are
 * judged too.  The rules are postgres_fdw's and dblink's: no stream sets
 * libpq's debug or OAuth options; a stream of a role that is not a
 * superuser holds a password and names no file or service of this
 * server.  Nothing here keeps, logs or shows a password.
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "libpq-fe.h"

#include "stream_conninfo.h"

/*
 * The longest connection string a stream may have, its terminator
 * included: walreceiver's MAXCONNINFO.
 */
#define PC_MAX_CONNINFO			1024

/*
 * Connection options that a stream of an owner who is not a superuser may
 * not set: each makes the connection use a file or a service entry of
 * this server (sslrootcert=system names none).  sslcertmode (libpq 16 and
 * later) other than disable has libpq present this server's OS user's
 * default client certificate (~/.postgresql/postgresql.crt); left out,
 * it is "allow" by libpq's default, which the worker is to override.
 */
typedef struct ServerFileOption
{
	const char *keyword;
	const char *allowed;		/* a value that names no file, or NULL */
} ServerFileOption;

static const ServerFileOption server_file_options[] = {
	{"passfile", NULL},
	{"service", NULL},
	{"sslcert", NULL},
	{"sslkey", NULL},
	{"sslrootcert", "system"},
	{"sslcrl", NULL},
	{"sslcrldir", NULL},
	{"sslcertmode", "disable"},
};

/*
 * Whether no stream may set a connection option, a superuser's neither:
 * the options libpq marks as debug options ('D': replication, which
 * pc_stream_check_conninfo() refuses first with a reason of its own, and since
 * PostgreSQL 18 scram_client_key, scram_server_key and sslkeylogfile)
 * and the OAuth options (oauth_*, PostgreSQL 18), which a background
 * worker has no user to ask for.  postgres_fdw and dblink refuse the
 * same.  Decided by what the libpq this runs with says of the option,
 * so that options of a later libpq are covered too.
 */
static bool
refused_option(const PQconninfoOption *o)
{
	return strchr(o->dispchar, 'D') != NULL ||
		strncmp(o->keyword, "oauth_", strlen("oauth_")) == 0;
}

/*
 * Whether projcache.streams leaves an option out of the connection
 * string it shows: the password, any option libpq shows as secret ('*',
 * such as sslpassword) and the debug options ('D').
 */
static bool
hidden_option(const PQconninfoOption *o)
{
	return strcmp(o->keyword, "password") == 0 ||
		strchr(o->dispchar, '*') != NULL ||
		strchr(o->dispchar, 'D') != NULL;
}

/* The value a connection option has in opts, or NULL. */
static const char *
conninfo_value(PQconninfoOption *opts, const char *keyword)
{
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (strcmp(o->keyword, keyword) == 0)
			return o->val;
	return NULL;
}

/*
 * A stream's connection string, parsed by libpq as its worker will parse
 * it.  It may not set replication (the worker connects with
 * replication=database) nor a dbname that is a connection string itself
 * (its options would not be the ones checked here).  With need_password
 * (the stream's owner, or the caller, is not a superuser) it must hold a
 * password that is not empty and no option that uses a file or a service
 * of this server: as postgres_fdw asks of a user mapping, so that the
 * connection never reaches a server through this server's own trust or
 * peer authentication or its files.
 */
void
pc_stream_check_conninfo(const char *stream, const char *conninfo,
						 bool need_password)
{
	PQconninfoOption *opts;
	char	   *err = NULL;
	const char *v;
	bool		sets_replication;
	bool		dbname_is_conninfo;
	bool		has_password;
	const char *file_option = NULL;
	const char *refused = NULL;

	if (strlen(conninfo) >= PC_MAX_CONNINFO)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("connection string of stream \"%s\" is %zu bytes long, longer than %d",
						stream, strlen(conninfo), PC_MAX_CONNINFO - 1)));

	opts = PQconninfoParse(conninfo, &err);
	if (opts == NULL)
	{
		char	   *detail = err != NULL ? pstrdup(err) : pstrdup("out of memory");
		size_t		len = strlen(detail);

		if (err != NULL)
			PQfreemem(err);
		while (len > 0 && detail[len - 1] == '\n')
			detail[--len] = '\0';
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("invalid connection string for stream \"%s\"", stream),
				 errdetail_internal("%s", detail)));
	}

	sets_replication = conninfo_value(opts, "replication") != NULL;
	v = conninfo_value(opts, "dbname");
	dbname_is_conninfo = v != NULL &&
		(strchr(v, '=') != NULL || strncmp(v, "postgresql://", 13) == 0 ||
		 strncmp(v, "postgres://", 11) == 0);
	v = conninfo_value(opts, "password");
	has_password = v != NULL && v[0] != '\0';
	for (int i = 0; i < lengthof(server_file_options) && file_option == NULL;
		 i++)
	{
		v = conninfo_value(opts, server_file_options[i].keyword);
		if (v != NULL &&
			(server_file_options[i].allowed == NULL ||
			 strcmp(v, server_file_options[i].allowed) != 0))
			file_option = server_file_options[i].keyword;
	}
	for (PQconninfoOption *o = opts; o->keyword != NULL && refused == NULL;
		 o++)
		if (o->val != NULL && strcmp(o->keyword, "replication") != 0 &&
			refused_option(o))
			refused = pstrdup(o->keyword);
	PQconninfoFree(opts);

	if (sets_replication)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("connection string of stream \"%s\" sets \"replication\"",
						stream),
				 errdetail("The stream's worker connects with replication=database.")));
	if (dbname_is_conninfo)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("connection string of stream \"%s\" has a dbname that is a connection string",
						stream),
				 errdetail("A stream's dbname names the source database."),
				 errhint("Write each connection option in the connection string itself.")));
	if (refused != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED),
				 errmsg("connection option \"%s\" is not allowed in a stream",
						refused),
				 errdetail("A stream's connection may set neither libpq's debug options nor its OAuth options.")));
	if (!need_password)
		return;
	if (!has_password)
		ereport(ERROR,
				(errcode(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED),
				 errmsg("password is required"),
				 errdetail("A stream of a role that is not a superuser must have a password in its connection string."),
				 errhint("Add password=... to the connection string; the source must ask for it.")));
	if (file_option != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED),
				 errmsg("connection option \"%s\" is not allowed in the stream of a role that is not a superuser",
						file_option),
				 errdetail("It would make the connection use a file or a service entry of this server."),
				 errhint("Write the connection's options, its password among them, in the connection string itself.")));
}

/*
 * A connection string without its password, nor any other option
 * hidden_option() names, rebuilt from libpq's parse; NULL if libpq cannot
 * parse it.
 */
char *
pc_stream_conninfo_shown(const char *conninfo)
{
	PQconninfoOption *opts;
	char	   *err = NULL;
	StringInfoData buf;

	opts = PQconninfoParse(conninfo, &err);
	if (opts == NULL)
	{
		if (err != NULL)
			PQfreemem(err);
		return NULL;
	}
	initStringInfo(&buf);
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL || hidden_option(o))
			continue;
		if (buf.len > 0)
			appendStringInfoChar(&buf, ' ');
		appendStringInfo(&buf, "%s='", o->keyword);
		for (const char *p = o->val; *p; p++)
		{
			if (*p == '\'' || *p == '\\')
				appendStringInfoChar(&buf, '\\');
			appendStringInfoChar(&buf, *p);
		}
		appendStringInfoChar(&buf, '\'');
	}
	PQconninfoFree(opts);
	return buf.data;
}
