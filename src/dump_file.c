/*-------------------------------------------------------------------------
 *
 * dump_file.c
 *	  Write and read the dump files of the caches (see dump_file.h).
 *
 * The writer works on a plain file descriptor (BasicOpenFilePerm) with a
 * buffer of its own: a key map dump is written a slice at a time between
 * the worker's batches, and a descriptor from AllocateFile() would be
 * closed by the end of the first transaction in between.  The reader runs
 * in one go, inside or outside a transaction, on OpenTransientFile().
 *
 * Copyright (c) 2026, projcache developers
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xlog.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dump_file.h"

#define PC_DUMP_MAGIC		0x50434431	/* "PCD1" */
#define PC_DUMP_VERSION		1
#define PC_DUMP_TRAILER		((uint32) 0xFFFFFFFF)
#define PC_DUMP_BUFFER		(64 * 1024)

typedef struct DumpHeader
{
	uint32		magic;
	uint32		version;
	uint32		kind;
	uint32		generation;		/* the writer's; 0 if none (as 1.2 wrote) */
	uint64		system_identifier;
	int64		written_at;		/* TimestampTz */
	pg_crc32c	crc;			/* of the fields above */
	uint32		reserved2;		/* 0 */
} DumpHeader;

/* Before each payload; the CRC covers len and then the payload. */
typedef struct DumpRecordHeader
{
	uint32		len;			/* or PC_DUMP_TRAILER */
	pg_crc32c	crc;
} DumpRecordHeader;

struct PcDumpWriter
{
	char	   *path;
	char	   *tmp_path;
	int			fd;
	bool		failed;			/* a write failed: only discard is left */
	uint64		records;
	char	   *buf;
	Size		used;
};

struct PcDumpLog
{
	char	   *path;
	char	   *tmp_path;
	int			fd;
	bool		committed;		/* renamed to path */
	bool		failed;
	uint64		size;			/* bytes in the file */
	StringInfoData record;		/* one record, written in one call */
};

struct PcDumpReader
{
	char	   *path;
	int			fd;
	off_t		size;
	off_t		pos;
	TimestampTz written_at;
	uint32		generation;
	uint64		records;
	uint64		handed_out;
	char	   *buf;			/* PC_DUMP_BUFFER bytes read ahead */
	off_t		buf_at;			/* the file offset of buf[0] */
	Size		buf_len;		/* bytes of buf read from there */
};

static pg_crc32c
record_crc(uint32 len, const void *payload, Size payload_len)
{
	pg_crc32c	crc;

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, &len, sizeof(len));
	if (payload_len > 0)
		COMP_CRC32C(crc, payload, payload_len);
	FIN_CRC32C(crc);
	return crc;
}

static pg_crc32c
header_crc(const DumpHeader *h)
{
	pg_crc32c	crc;

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, h, offsetof(DumpHeader, crc));
	FIN_CRC32C(crc);
	return crc;
}

/* ----------------------------------------------------------------
 * Writing
 * ----------------------------------------------------------------
 */

static void
writer_fail(PcDumpWriter *w, const char *what)
{
	if (!w->failed)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not %s projcache dump file \"%s\": %m",
						what, w->tmp_path)));
	w->failed = true;
}

static void
writer_flush(PcDumpWriter *w)
{
	Size		done = 0;

	while (!w->failed && done < w->used)
	{
		ssize_t		n = write(w->fd, w->buf + done, w->used - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
		{
			if (n == 0)
				errno = ENOSPC;
			writer_fail(w, "write");
			break;
		}
		done += n;
	}
	w->used = 0;
}

static void
writer_put(PcDumpWriter *w, const void *data, Size len)
{
	const char *p = data;

	while (len > 0 && !w->failed)
	{
		Size		n = Min(len, PC_DUMP_BUFFER - w->used);

		memcpy(w->buf + w->used, p, n);
		w->used += n;
		p += n;
		len -= n;
		if (w->used == PC_DUMP_BUFFER)
			writer_flush(w);
	}
}

/* A header of this cluster, written now. */
static void
fill_header(DumpHeader *h, PcDumpKind kind, uint32 generation)
{
	memset(h, 0, sizeof(*h));
	h->magic = PC_DUMP_MAGIC;
	h->version = PC_DUMP_VERSION;
	h->kind = (uint32) kind;
	h->generation = generation;
	h->system_identifier = GetSystemIdentifier();
	h->written_at = GetCurrentTimestamp();
	h->crc = header_crc(h);
}

PcDumpWriter *
pc_dump_begin(const char *path, PcDumpKind kind)
{
	return pc_dump_begin_generation(path, kind, 0);
}

/* The same, with a generation in the header (pc_dump_generation). */
PcDumpWriter *
pc_dump_begin_generation(const char *path, PcDumpKind kind, uint32 generation)
{
	PcDumpWriter *w = palloc0(sizeof(PcDumpWriter));
	DumpHeader	h;

	w->path = pstrdup(path);
	w->tmp_path = psprintf("%s.tmp", path);
	w->buf = palloc(PC_DUMP_BUFFER);
	w->fd = BasicOpenFilePerm(w->tmp_path,
							  O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY,
							  S_IRUSR | S_IWUSR);
	if (w->fd < 0)
	{
		writer_fail(w, "create");
		pc_dump_discard(w);
		return NULL;
	}
	fill_header(&h, kind, generation);
	writer_put(w, &h, sizeof(h));
	return w;
}

void
pc_dump_write(PcDumpWriter *w, const void *payload, uint32 len)
{
	DumpRecordHeader rh;

	Assert(len < PC_DUMP_TRAILER && len <= PC_DUMP_MAX_RECORD);
	rh.len = len;
	rh.crc = record_crc(len, payload, len);
	writer_put(w, &rh, sizeof(rh));
	writer_put(w, payload, len);
	w->records++;
}

bool
pc_dump_finish(PcDumpWriter *w, uint64 *records)
{
	DumpRecordHeader rh;
	bool		ok;

	rh.len = PC_DUMP_TRAILER;
	rh.crc = record_crc(rh.len, &w->records, sizeof(w->records));
	writer_put(w, &rh, sizeof(rh));
	writer_put(w, &w->records, sizeof(w->records));
	writer_flush(w);
	if (!w->failed && pg_fsync(w->fd) != 0)
		writer_fail(w, "fsync");
	if (close(w->fd) != 0)
		writer_fail(w, "close");
	w->fd = -1;
	/* durable_rename() fsyncs the file again and the directory. */
	if (!w->failed && durable_rename(w->tmp_path, w->path, LOG) != 0)
		w->failed = true;
	ok = !w->failed;
	if (records != NULL)
		*records = w->records;
	pc_dump_discard(w);
	return ok;
}

/* Give up a dump: the previous one (if any) stays. */
void
pc_dump_discard(PcDumpWriter *w)
{
	if (w->fd >= 0)
		close(w->fd);
	/* After a successful rename there is no temporary file left. */
	if (unlink(w->tmp_path) != 0 && errno != ENOENT)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not remove file \"%s\": %m", w->tmp_path)));
	pfree(w->buf);
	pfree(w->tmp_path);
	pfree(w->path);
	pfree(w);
}

/* ----------------------------------------------------------------
 * Reading
 * ----------------------------------------------------------------
 */

/*
 * Read exactly len bytes at the reader's position; false at EOF or error.
 * Reads ahead PC_DUMP_BUFFER bytes at a time: a record is two small reads,
 * and a million of them one read call each would cost more than the rest
 * of a load.  A read longer than the buffer goes straight to dst.
 */
static bool
reader_get(PcDumpReader *r, void *dst, Size len)
{
	char	   *p = dst;

	if (r->pos + (off_t) len > r->size)
		return false;
	while (len > 0)
	{
		Size		n;

		if (r->pos < r->buf_at || r->pos >= r->buf_at + (off_t) r->buf_len)
		{
			bool		direct = len >= PC_DUMP_BUFFER;
			ssize_t		got = pg_pread(r->fd, direct ? p : r->buf,
									   direct ? len : PC_DUMP_BUFFER,
									   r->pos);

			if (got < 0 && errno == EINTR)
				continue;
			if (got <= 0)
				return false;
			if (direct)
			{
				p += got;
				len -= got;
				r->pos += got;
				continue;
			}
			r->buf_at = r->pos;
			r->buf_len = got;
		}
		n = Min(len, (Size) (r->buf_at + (off_t) r->buf_len - r->pos));
		memcpy(p, r->buf + (r->pos - r->buf_at), n);
		p += n;
		len -= n;
		r->pos += n;
	}
	return true;
}

static void
reader_refuse(PcDumpReader *r, const char *why)
{
	ereport(LOG,
			(errmsg("projcache dump file \"%s\" ignored: %s", r->path, why),
			 errhint("The cache starts cold.  Remove the file to silence this message.")));
}

/*
 * Read the next record: its payload (palloc'd, or NULL for the trailer,
 * whose count goes to *count) and length.  False, with *why set, if the
 * file breaks off or a checksum fails.
 */
static bool
reader_record(PcDumpReader *r, char **payload, uint32 *len, uint64 *count,
			  const char **why)
{
	DumpRecordHeader rh;
	off_t		at = r->pos;

	*payload = NULL;
	if (!reader_get(r, &rh, sizeof(rh)))
	{
		*why = psprintf("it breaks off at byte %lld, before its trailer",
						(long long) at);
		return false;
	}
	if (rh.len == PC_DUMP_TRAILER)
	{
		if (!reader_get(r, count, sizeof(*count)) ||
			!EQ_CRC32C(rh.crc, record_crc(rh.len, count, sizeof(*count))))
		{
			*why = psprintf("its trailer at byte %lld is damaged",
							(long long) at);
			return false;
		}
		*len = 0;
		return true;
	}
	if (rh.len > PC_DUMP_MAX_RECORD || r->pos + (off_t) rh.len > r->size)
	{
		*why = psprintf("the record at byte %lld is longer than the rest of the file",
						(long long) at);
		return false;
	}
	*payload = palloc(Max(rh.len, 1));
	if (!reader_get(r, *payload, rh.len) ||
		!EQ_CRC32C(rh.crc, record_crc(rh.len, *payload, rh.len)))
	{
		pfree(*payload);
		*payload = NULL;
		*why = psprintf("the checksum of the record at byte %lld does not match",
						(long long) at);
		return false;
	}
	*len = rh.len;
	return true;
}

/* Read and check the header; NULL if it is sound, else why not. */
static const char *
read_header(PcDumpReader *r, DumpHeader *h, PcDumpKind kind)
{
	if (r->size == 0)
		return "it is empty";
	if (!reader_get(r, h, sizeof(*h)))
		return "it is shorter than its header";
	if (h->magic != PC_DUMP_MAGIC)
		return "it is not a projcache dump file";
	if (!EQ_CRC32C(h->crc, header_crc(h)))
		return "the checksum of its header does not match";
	if (h->version != PC_DUMP_VERSION)
		return psprintf("its format version is %u, this projcache reads version %d",
						h->version, PC_DUMP_VERSION);
	if (h->kind != (uint32) kind)
		return "it holds another cache";
	if (h->system_identifier != GetSystemIdentifier())
		return psprintf("it was written by another cluster (system identifier "
						UINT64_FORMAT ", this one " UINT64_FORMAT ")",
						h->system_identifier, GetSystemIdentifier());
	return NULL;
}

/* Open path for reading, with a reader around it; NULL if it is missing. */
static PcDumpReader *
reader_open(const char *path)
{
	PcDumpReader *r;
	struct stat st;
	int			fd;

	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not open projcache dump file \"%s\": %m",
							path)));
		return NULL;
	}
	r = palloc0(sizeof(PcDumpReader));
	r->path = pstrdup(path);
	r->fd = fd;
	r->buf = palloc(PC_DUMP_BUFFER);
	if (fstat(fd, &st) != 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not stat projcache dump file \"%s\": %m",
						path)));
		pc_dump_close(r);
		return NULL;
	}
	r->size = st.st_size;
	return r;
}

PcDumpReader *
pc_dump_open(const char *path, PcDumpKind kind)
{
	PcDumpReader *r;
	DumpHeader	h;
	uint64		count = 0;
	uint64		seen = 0;
	const char *why;

	r = reader_open(path);
	if (r == NULL)
		return NULL;
	why = read_header(r, &h, kind);

	/* The whole file, before anything is handed out. */
	while (why == NULL)
	{
		char	   *payload;
		uint32		len;

		if (!reader_record(r, &payload, &len, &count, &why))
			break;
		if (payload == NULL)
		{
			if (count != seen)
				why = psprintf("its trailer counts " UINT64_FORMAT " records, it holds " UINT64_FORMAT,
							   count, seen);
			else if (r->pos != r->size)
				why = psprintf("it goes on after its trailer, at byte %lld",
							   (long long) r->pos);
			break;
		}
		pfree(payload);
		seen++;
	}
	if (why != NULL)
	{
		reader_refuse(r, why);
		pc_dump_close(r);
		return NULL;
	}
	r->written_at = h.written_at;
	r->generation = h.generation;
	r->records = count;
	r->pos = sizeof(DumpHeader);
	return r;
}

TimestampTz
pc_dump_written_at(const PcDumpReader *r)
{
	return r->written_at;
}

/* Milliseconds since it was written (0 if its time is not past). */
int64
pc_dump_age_ms(const PcDumpReader *r)
{
	long		secs;
	int			usecs;

	TimestampDifference(r->written_at, GetCurrentTimestamp(), &secs, &usecs);
	return (int64) secs * 1000 + usecs / 1000;
}

/* The generation its writer gave it (0 for a dump of 1.2). */
uint32
pc_dump_generation(const PcDumpReader *r)
{
	return r->generation;
}

uint64
pc_dump_count(const PcDumpReader *r)
{
	return r->records;
}

bool
pc_dump_next(PcDumpReader *r, char **payload, uint32 *len)
{
	uint64		count;
	const char *why;

	if (r->handed_out == r->records)
		return false;
	/* Checked by pc_dump_open(): only a file changed since then fails. */
	if (!reader_record(r, payload, len, &count, &why) || *payload == NULL)
	{
		reader_refuse(r, "it changed while it was read");
		r->handed_out = r->records;
		return false;
	}
	r->handed_out++;
	return true;
}

void
pc_dump_close(PcDumpReader *r)
{
	if (r->fd >= 0)
		CloseTransientFile(r->fd);
	pfree(r->buf);
	pfree(r->path);
	pfree(r);
}

/* ----------------------------------------------------------------
 * Logs
 * ----------------------------------------------------------------
 */

static bool
log_fail(PcDumpLog *log, const char *what)
{
	if (!log->failed)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not %s projcache dump file \"%s\": %m",
						what, log->committed ? log->path : log->tmp_path)));
	log->failed = true;
	return false;
}

/* Write all of buf at the end of the log. */
static bool
log_write(PcDumpLog *log, const char *buf, Size len)
{
	while (len > 0)
	{
		ssize_t		n = write(log->fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
		{
			if (n == 0)
				errno = ENOSPC;
			return log_fail(log, "write");
		}
		buf += n;
		len -= n;
		log->size += n;
	}
	return true;
}

PcDumpLog *
pc_dump_log_begin(const char *path, PcDumpKind kind, uint32 generation)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	PcDumpLog  *log = palloc0(sizeof(PcDumpLog));
	DumpHeader	h;

	log->path = pstrdup(path);
	log->tmp_path = psprintf("%s.tmp", path);
	initStringInfo(&log->record);
	MemoryContextSwitchTo(old);
	log->fd = BasicOpenFilePerm(log->tmp_path,
								O_WRONLY | O_CREAT | O_TRUNC | PG_BINARY,
								S_IRUSR | S_IWUSR);
	if (log->fd < 0)
	{
		log_fail(log, "create");
		pc_dump_log_close(log);
		return NULL;
	}
	fill_header(&h, kind, generation);
	if (!log_write(log, (const char *) &h, sizeof(h)))
	{
		pc_dump_log_close(log);
		return NULL;
	}
	return log;
}

/* One record, in one write() call: a crash leaves it whole or cut off. */
bool
pc_dump_log_append(PcDumpLog *log, const void *payload, uint32 len)
{
	DumpRecordHeader rh;

	Assert(len < PC_DUMP_TRAILER && len <= PC_DUMP_MAX_RECORD);
	if (log->failed)
		return false;
	rh.len = len;
	rh.crc = record_crc(len, payload, len);
	resetStringInfo(&log->record);
	appendBinaryStringInfo(&log->record, (const char *) &rh, sizeof(rh));
	appendBinaryStringInfo(&log->record, payload, len);
	return log_write(log, log->record.data, log->record.len);
}

bool
pc_dump_log_commit(PcDumpLog *log)
{
	if (log->failed)
		return false;
	if (pg_fsync(log->fd) != 0)
		return log_fail(log, "fsync");
	/* durable_rename() fsyncs the directory too; fd goes on at path. */
	if (durable_rename(log->tmp_path, log->path, LOG) != 0)
	{
		log->failed = true;
		return false;
	}
	log->committed = true;
	return true;
}

bool
pc_dump_log_sync(PcDumpLog *log)
{
	if (log->failed)
		return false;
	if (pg_fdatasync(log->fd) != 0)
		return log_fail(log, "fsync");
	return true;
}

uint64
pc_dump_log_size(const PcDumpLog *log)
{
	return log->size;
}

/* Close the log; one never committed leaves no file. */
void
pc_dump_log_close(PcDumpLog *log)
{
	if (log->fd >= 0)
		close(log->fd);
	if (!log->committed && unlink(log->tmp_path) != 0 && errno != ENOENT)
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not remove file \"%s\": %m", log->tmp_path)));
	pfree(log->record.data);
	pfree(log->tmp_path);
	pfree(log->path);
	pfree(log);
}

/* Is the rest of the file from the reader's position zeros? */
static bool
reader_rest_is_zero(PcDumpReader *r)
{
	char		c;

	while (r->pos < r->size)
	{
		if (!reader_get(r, &c, 1) || c != 0)
			return false;
	}
	return true;
}

/*
 * Read a log: hand each whole record to record(), in order.  A record cut
 * off at the end of the file, or a last record that fails its checksum
 * with nothing but zeros after it (what a crash while appending can leave
 * behind), ends the log; any other damage refuses it.
 */
PcDumpLogStatus
pc_dump_log_read(const char *path, PcDumpKind kind, uint32 *generation,
				 void (*record) (const char *payload, uint32 len, void *arg),
				 void *arg)
{
	PcDumpReader *r;
	DumpHeader	h;
	const char *why;

	r = reader_open(path);
	if (r == NULL)
		return access(path, F_OK) == 0 ? PC_DUMP_LOG_DAMAGED :
			PC_DUMP_LOG_MISSING;
	why = read_header(r, &h, kind);
	while (why == NULL && r->pos < r->size)
	{
		DumpRecordHeader rh;
		off_t		at = r->pos;
		char	   *payload;

		CHECK_FOR_INTERRUPTS();
		if (!reader_get(r, &rh, sizeof(rh)) ||
			(rh.len <= PC_DUMP_MAX_RECORD &&
			 r->pos + (off_t) rh.len > r->size))
			break;				/* cut off: the end */
		if (rh.len > PC_DUMP_MAX_RECORD)
			payload = NULL;
		else
		{
			payload = palloc(Max(rh.len, 1));
			if (!reader_get(r, payload, rh.len) ||
				!EQ_CRC32C(rh.crc, record_crc(rh.len, payload, rh.len)))
			{
				pfree(payload);
				payload = NULL;
			}
		}
		if (payload == NULL)
		{
			if (!reader_rest_is_zero(r))
				why = psprintf("the record at byte %lld is damaged",
							   (long long) at);
			break;
		}
		record(payload, rh.len, arg);
		pfree(payload);
	}
	if (why != NULL)
	{
		reader_refuse(r, why);
		pc_dump_close(r);
		return PC_DUMP_LOG_DAMAGED;
	}
	*generation = h.generation;
	pc_dump_close(r);
	return PC_DUMP_LOG_OK;
}
