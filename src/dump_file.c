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
#include "port/pg_crc32c.h"
#include "storage/fd.h"
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
	uint32		reserved;		/* 0 */
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

struct PcDumpReader
{
	char	   *path;
	int			fd;
	off_t		size;
	off_t		pos;
	TimestampTz written_at;
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

PcDumpWriter *
pc_dump_begin(const char *path, PcDumpKind kind)
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
	memset(&h, 0, sizeof(h));
	h.magic = PC_DUMP_MAGIC;
	h.version = PC_DUMP_VERSION;
	h.kind = (uint32) kind;
	h.system_identifier = GetSystemIdentifier();
	h.written_at = GetCurrentTimestamp();
	h.crc = header_crc(&h);
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

PcDumpReader *
pc_dump_open(const char *path, PcDumpKind kind)
{
	PcDumpReader *r;
	struct stat st;
	DumpHeader	h;
	uint64		count = 0;
	uint64		seen = 0;
	const char *why = NULL;
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

	if (r->size == 0)
		why = "it is empty";
	else if (!reader_get(r, &h, sizeof(h)))
		why = "it is shorter than its header";
	else if (h.magic != PC_DUMP_MAGIC)
		why = "it is not a projcache dump file";
	else if (!EQ_CRC32C(h.crc, header_crc(&h)))
		why = "the checksum of its header does not match";
	else if (h.version != PC_DUMP_VERSION)
		why = psprintf("its format version is %u, this projcache reads version %d",
					   h.version, PC_DUMP_VERSION);
	else if (h.kind != (uint32) kind)
		why = "it holds another cache";
	else if (h.system_identifier != GetSystemIdentifier())
		why = psprintf("it was written by another cluster (system identifier "
					   UINT64_FORMAT ", this one " UINT64_FORMAT ")",
					   h.system_identifier, GetSystemIdentifier());

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
	r->records = count;
	r->pos = sizeof(DumpHeader);
	return r;
}

TimestampTz
pc_dump_written_at(const PcDumpReader *r)
{
	return r->written_at;
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
