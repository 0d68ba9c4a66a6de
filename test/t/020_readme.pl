# Copyright (c) 2026, projcache developers
#
# The README and the pages of doc/, run as written.  Every block fenced as
# ```sql runs, in order, on a new server set up as the Install section
# says, so that each example works when pasted on a fresh server.  The
# order is README.md first, then each page of doc/ in the order the
# README's "## Contents" first links it: a page is run once it is listed.
#
# The server: the first ```ini block of the section headed "Install" (a
# "#" or "##" heading, on whichever page) is appended to postgresql.conf
# as it is (no test clock, no other projcache setting), and the database
# that the first ```sh block there creates (`createdb NAME`) is created;
# it must be the projcache.database of that ini block.
#
# Conventions of the SQL blocks (doc/install.md and doc/tests.md say the
# same):
#
#   - A block runs in projcache.database, as the bootstrap superuser, in one
#     psql session, statement by statement (autocommit).  Its first lines
#     may change that:
#       -- as ROLE        run it as ROLE (SET ROLE first)
#       -- in DATABASE    run it in DATABASE
#       -- needs: WHAT    it needs what a single server lacks (another
#                         PostgreSQL, a standby): skipped
#   - "-- fails: SQLSTATE" on a line of its own: the next statement must
#     fail with exactly that SQLSTATE.  Every other statement must succeed
#     with no ERROR and no WARNING.
#   - No psql meta-commands (\gset, \c ...) in a block.
#
# Statements are split here (outside quotes, dollar quotes and comments) so
# that each one's result can be told apart: psql runs the whole block, with
# a \warn marker before each statement, and its stderr is cut at the
# markers.  Nothing here sleeps: where a block needs the worker, the
# example waits itself (get(key, '5s')).
#
# After the last block, the claims of the "Uninstall" section are checked:
# a trigger that calls invalidate() fails with 42883 once the extension is
# dropped; an extension created again before a restart sees the keys
# cached before; the server starts without the library (and CREATE
# EXTENSION then fails with 55000).  And the tables of the columns of
# projcache.entries, stats and snapshots are checked against the views,
# column by column, wherever they are.
#
# Before any server starts, the pages are checked as a newcomer finds
# them: the README's "## Quick start" and "## Contents" are its first
# headings, within its first 50 lines; every page of doc/ is linked from
# the contents; every "##" and "###" heading of the README and of each
# page is linked from the contents by its GitHub anchor; and every
# relative link of the README and the pages names a file that exists,
# and, into a Markdown file, one of its headings' anchors.

use strict;
use warnings;

use Encode qw(decode);
use File::Basename qw(dirname);
use File::Spec;
use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $root = File::Spec->rel2abs("$FindBin::RealBin/../..");

# A file of the tree, by its path from the top, as lines of characters.
sub read_lines
{
	my ($rel) = @_;
	return split /\n/, decode('UTF-8', slurp_file("$root/$rel")), -1;
}

# The headings of a Markdown file, outside fenced blocks: { level, text,
# anchor, line }.  The anchor is GitHub's: the heading's text without its
# Markdown (code marks, links), lower-cased, with every character but
# letters, digits, '_', '-' and ' ' taken out, and spaces made '-'; a
# second heading of the same anchor gets "-1", a third "-2".
sub headings
{
	my (@lines) = @_;
	my (@heads, %seen);
	my $fence;
	for my $i (0 .. $#lines)
	{
		my $line = $lines[$i];
		if ($line =~ /^ *(`{3,})/)
		{
			if (!defined $fence) { $fence = length $1; }
			elsif (length($1) >= $fence && $line =~ /^ *`+\s*$/) { undef $fence; }
			next;
		}
		next if defined $fence;
		next unless $line =~ /^(#{1,6}) +(.*?)\s*#*\s*$/;
		my ($level, $text) = (length $1, $2);
		(my $anchor = $text) =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;
		$anchor =~ s/`//g;
		$anchor = lc $anchor;
		$anchor =~ s/[^\w\- ]//g;
		$anchor =~ s/ /-/g;
		my $n = $seen{$anchor}++;
		$anchor .= "-$n" if $n;
		push @heads,
		  { level => $level, text => $text, anchor => $anchor, line => $i + 1 };
	}
	return @heads;
}

# The relative links of a Markdown file, outside fenced blocks and code
# spans: { target, line }.  Links with a scheme (https:, mailto:) are left
# out.
sub relative_links
{
	my (@lines) = @_;
	my @links;
	my $fence;
	for my $i (0 .. $#lines)
	{
		my $line = $lines[$i];
		if ($line =~ /^ *(`{3,})/)
		{
			if (!defined $fence) { $fence = length $1; }
			elsif (length($1) >= $fence && $line =~ /^ *`+\s*$/) { undef $fence; }
			next;
		}
		next if defined $fence;
		# Code spans go, but a link's text may be one: [`x`](y).
		(my $text = $line) =~ s/`[^`]*`/C/g;
		while ($text =~ /\]\(([^)\s]+)\)/g)
		{
			my $target = $1;
			next if $target =~ /^[A-Za-z][\w+.-]*:/;
			push @links, { target => $target, line => $i + 1 };
		}
	}
	return @links;
}

# ------------------------------------------------------------------------
# The README's contents, and the pages in their order.
# ------------------------------------------------------------------------

my @readme = read_lines('README.md');
my @readme_heads = headings(@readme);
my @front = grep { $_->{level} == 2 } @readme_heads;
is_deeply([ map { $_->{text} } @front[ 0 .. 1 ] ], [ 'Quick start', 'Contents' ],
	'README.md: its first headings are "Quick start" and "Contents"');
ok($front[1] && $front[1]{line} <= 50,
	'README.md: "## Contents" is within its first 50 lines (line '
	  . ($front[1] ? $front[1]{line} : '?') . ')');

# The lines of "## Contents", up to the next "##" heading.
my @contents;
{
	my ($from) = grep { $_->{text} eq 'Contents' && $_->{level} == 2 } @readme_heads;
	BAIL_OUT('README.md: no "## Contents"') unless $from;
	my ($next) = grep { $_->{level} <= 2 && $_->{line} > $from->{line} } @readme_heads;
	my $to = $next ? $next->{line} - 1 : scalar @readme;
	@contents = @readme[ $from->{line} .. $to - 1 ];
}

# Every target the contents link, as a path from the top (#anchor kept).
my %listed;
my @pages;
for my $link (relative_links(@contents))
{
	my ($path, $anchor) = $link->{target} =~ /^([^#]*)(?:#(.*))?$/;
	$path = 'README.md' if $path eq '';
	$listed{ $path . (defined $anchor ? "#$anchor" : '') } = 1;
	push @pages, $path
	  if $path =~ m{^doc/[^/]+\.md$} && !grep { $_ eq $path } @pages;
}
ok(scalar(@pages) > 0, 'README.md: the contents list pages of doc/: ' . scalar(@pages));

opendir(my $dh, "$root/doc") or BAIL_OUT("could not open $root/doc: $!");
my @doc_files = sort grep { /\.md$/ } readdir $dh;
closedir $dh;
for my $f (@doc_files)
{
	ok($listed{"doc/$f"}, "README.md: the contents link doc/$f");
}

my %file_lines = ('README.md' => \@readme);
$file_lines{$_} = [ read_lines($_) ] for @pages;
my %file_heads = map { $_ => [ headings(@{ $file_lines{$_} }) ] } keys %file_lines;

# Every "##" and "###" heading, linked from the contents.
for my $file ('README.md', @pages)
{
	for my $h (@{ $file_heads{$file} })
	{
		next unless $h->{level} == 2 || $h->{level} == 3;
		next if $file eq 'README.md' && $h->{text} eq 'Contents';
		my $target = ($file eq 'README.md' ? '' : $file) . "#$h->{anchor}";
		ok($listed{ $target =~ /^#/ ? "README.md$target" : $target },
			"$file:$h->{line}: the contents link \"$h->{text}\" ($target)");
	}
}

# Every relative link, to a file that exists and, into a Markdown file, to
# one of its headings.
for my $file ('README.md', @pages)
{
	my $dir = dirname($file);
	for my $link (relative_links(@{ $file_lines{$file} }))
	{
		my ($path, $anchor) = $link->{target} =~ /^([^#]*)(?:#(.*))?$/;
		my $rel = $path eq '' ? $file : "$dir/$path";
		$rel =~ s{^\./}{};
		1 while $rel =~ s{(^|/)(?!\.\./)[^/]+/\.\./}{$1};
		my $name = "$file:$link->{line}: link $link->{target}";
		if (!-e "$root/$rel")
		{
			fail("$name: no such file");
			next;
		}
		if (!defined $anchor)
		{
			pass($name);
			next;
		}
		$file_heads{$rel} //= [ headings(read_lines($rel)) ] if $rel =~ /\.md$/;
		ok($rel =~ /\.md$/ && grep({ $_->{anchor} eq $anchor } @{ $file_heads{$rel} }),
			"$name: a heading of $rel");
	}
}

# ------------------------------------------------------------------------
# The fenced blocks, with their file, language, section and line.
# ------------------------------------------------------------------------

my @blocks;
for my $file ('README.md', @pages)
{
	my @lines = @{ $file_lines{$file} };
	my $section = '';
	my $open;
	for my $i (0 .. $#lines)
	{
		my $line = $lines[$i];
		if (!$open)
		{
			if ($line =~ /^##? (.*\S)/)
			{
				$section = $1;
			}
			elsif ($line =~ /^( *)(`{3,})([\w-]*)\s*$/)
			{
				$open = {
					indent => length($1),
					fence => length($2),
					lang => $3,
					file => $file,
					section => $section,
					line => $i + 2,    # the block's first line, 1-based
					lines => []
				};
			}
			next;
		}
		if ($line =~ /^ *(`{3,})\s*$/ && length($1) >= $open->{fence})
		{
			$open->{text} = join("\n", @{ $open->{lines} }) . "\n";
			push @blocks, $open;
			undef $open;
			next;
		}
		# Take off the fence's indentation (a block inside a list item).
		(my $content = $line) =~ s/^ {0,$open->{indent}}//;
		push @{ $open->{lines} }, $content;
	}
	BAIL_OUT("$file: a code block opened at line $open->{line} is not closed")
	  if $open;
}
my @sql_blocks = grep { $_->{lang} eq 'sql' } @blocks;
ok(scalar(@sql_blocks) > 0, 'the README and its pages have sql blocks: ' . scalar(@sql_blocks));

# ------------------------------------------------------------------------
# The server, as the Install section says.
# ------------------------------------------------------------------------

my @install = grep { $_->{section} eq 'Install' } @blocks;
my ($conf_block) = grep { $_->{lang} eq 'ini' } @install;
my ($sh_block) = grep { $_->{lang} eq 'sh' && $_->{text} =~ /\bcreatedb\b/ }
  @install;
BAIL_OUT('no ```ini block (postgresql.conf) in the section "Install"')
  unless $conf_block;
BAIL_OUT('no ```sh block with createdb in the section "Install"')
  unless $sh_block;

my $conf = $conf_block->{text};
like($conf, qr/^shared_preload_libraries = 'projcache'/m,
	'Install: postgresql.conf preloads projcache');
my ($dbname) = $conf =~ /^projcache\.database = '(\w+)'/m;
ok(defined $dbname, 'Install: postgresql.conf sets projcache.database');
my ($created) = $sh_block->{text} =~ /\bcreatedb\s+(\w+)/;
is($created, $dbname, 'Install: createdb creates projcache.database');
BAIL_OUT('the Install section does not name its database')
  unless defined $dbname && defined $created && $created eq $dbname;

my $node = PostgreSQL::Test::Cluster->new('readme');
$node->init;
$node->append_conf('postgresql.conf', $conf);
$node->start;
$node->command_ok([ 'createdb', $dbname ], "createdb $dbname");
ok( $node->wait_for_log(
		qr/projcache scheduler ready in database "\Q$dbname\E"/, 0),
	"the scheduler is ready in $dbname");

# ------------------------------------------------------------------------
# Splitting a block into statements.
# ------------------------------------------------------------------------

# Returns a list of { text, line, fails } and a list of problems.  line is
# the statement's first line of code in its file.
sub split_statements
{
	my ($sql, $first_line) = @_;
	my (@stmts, @problems);
	my ($cur, $has_code, $fails, $start) = ('', 0, undef, undef);
	my $line = $first_line;
	my $len = length $sql;
	my $i = 0;

	# Copy $n characters into the statement, counting lines.
	my $take = sub {
		my ($n) = @_;
		my $s = substr($sql, $i, $n);
		$cur .= $s;
		$line += ($s =~ tr/\n//);
		$i += $n;
	};
	my $code = sub {
		if (!$has_code)
		{
			$has_code = 1;
			$start = $line;
		}
	};

	while ($i < $len)
	{
		my $rest = substr($sql, $i);
		if ($rest =~ /^--[^\n]*/)
		{
			my $comment = $&;
			if ($comment =~ /^--\s*fails:\s*(\S+)\s*$/)
			{
				my $sqlstate = $1;

				if ($has_code)
				{
					push @problems, "line $line: '-- fails:' inside a statement";
				}
				elsif (defined $fails)
				{
					push @problems, "line $line: two '-- fails:' for one statement";
				}
				elsif ($sqlstate !~ /^[0-9A-Z]{5}$/)
				{
					push @problems, "line $line: '$sqlstate' is not a SQLSTATE";
				}
				$fails = $sqlstate;
			}
			$take->(length $comment);
		}
		elsif ($rest =~ m{^/\*.*?\*/}s)
		{
			$take->(length $&);
		}
		elsif ($rest =~ /^[Ee]'(?:[^'\\]|\\.|'')*'/s
			&& ($i == 0 || substr($sql, $i - 1, 1) !~ /\w/))
		{
			$code->();
			$take->(length $&);
		}
		elsif ($rest =~ /^'(?:[^']|'')*'/s || $rest =~ /^"(?:[^"]|"")*"/s)
		{
			$code->();
			$take->(length $&);
		}
		elsif ($rest =~ /^(\$(?:[A-Za-z_]\w*)?\$)/
			&& ($i == 0 || substr($sql, $i - 1, 1) !~ /\w/))
		{
			my $tag = $1;
			my $end = index($sql, $tag, $i + length $tag);
			$code->();
			if ($end < 0)
			{
				push @problems, "line $line: $tag is not closed";
				$take->($len - $i);
			}
			else
			{
				$take->($end + length($tag) - $i);
			}
		}
		elsif ($rest =~ /^['"]/)
		{
			push @problems, "line $line: a quote is not closed";
			$take->($len - $i);
		}
		elsif (substr($rest, 0, 1) eq ';')
		{
			$take->(1);
			push @stmts, { text => $cur, line => $start, fails => $fails };
			($cur, $has_code, $fails, $start) = ('', 0, undef, undef);
		}
		else
		{
			$code->() if substr($rest, 0, 1) =~ /\S/;
			$take->(1);
		}
	}
	push @problems, "line $start: a statement does not end with ';'"
	  if $has_code;
	push @problems, "'-- fails: $fails' precedes no statement"
	  if !$has_code && defined $fails;
	return (\@stmts, \@problems);
}

# The first line of code of a statement, for test names.
sub first_code_line
{
	my ($text) = @_;
	for my $l (split /\n/, $text)
	{
		next if $l =~ /^\s*(--.*)?$/;
		$l =~ s/^\s+|\s+$//g;
		return $l;
	}
	return '';
}

# ------------------------------------------------------------------------
# Every sql block, in order.
# ------------------------------------------------------------------------

my $block_timeout = 4 * $PostgreSQL::Test::Utils::timeout_default;

for my $block (@sql_blocks)
{
	my $where = "$block->{file}:$block->{line}";
	my @lines = split /\n/, $block->{text};
	my ($role, $db, $needs);
	my $skip_lines = 0;

	# The marks on the block's first lines.
	for my $l (@lines)
	{
		if ($l =~ /^--\s*as\s+(\w+)\s*$/) { $role = $1; }
		elsif ($l =~ /^--\s*in\s+(\w+)\s*$/) { $db = $1; }
		elsif ($l =~ /^--\s*needs:\s*(.*\S)\s*$/) { $needs = $1; }
		else { last; }
		$skip_lines++;
	}
	$db //= $dbname;

	SKIP:
	{
		skip "$where needs: $needs", 1 if defined $needs;

		my @meta = grep { /^\s*\\/ } @lines;
		is_deeply(\@meta, [], "$where: no psql meta-commands");

		my ($stmts, $problems) =
		  split_statements($block->{text}, $block->{line});
		is_deeply($problems, [], "$where: the block splits into statements");
		next unless @$stmts;

		my $script = "\\set VERBOSITY verbose\n";
		$script .= "SET ROLE $role;\n" if defined $role;
		for my $n (0 .. $#$stmts)
		{
			$script .= "\\warn \@\@stmt $n\n$stmts->[$n]{text}\n";
		}
		$script .= "\\warn \@\@end\n";

		my ($stdout, $stderr) = ('', '');
		my $rc = $node->psql(
			$db, $script,
			stdout => \$stdout,
			stderr => \$stderr,
			on_error_stop => 0,
			timeout => $block_timeout);
		note("$where"
			  . (defined $role ? " as $role" : '')
			  . " in $db:\n$stdout");

		is($rc, 0, "$where: psql ran the block"
			  . (defined $role ? " as $role" : '') . " in $db");

		# Cut stderr at the markers: [before, 0 => ..., 1 => ..., end].
		my @parts = split /^\@\@(stmt \d+|end)\n?/m, $stderr, -1;
		my $before = shift @parts;
		my %seg = @parts;
		unlike($before, qr/\b(ERROR|FATAL|WARNING):/,
			"$where: the session started"
			  . (defined $role ? " (SET ROLE $role)" : ''))
		  or diag($before);
		ok(exists $seg{end}, "$where: psql reached the end of the block")
		  or diag($stderr);

		for my $n (0 .. $#$stmts)
		{
			my $st = $stmts->[$n];
			my $name = "$block->{file}:$st->{line}: " . first_code_line($st->{text});
			my $err = $seg{"stmt $n"} // '';
			my ($code) = $err =~ /\bERROR:\s+([0-9A-Z]{5}):/;
			if (defined $st->{fails})
			{
				is($code // 'success', $st->{fails},
					"$name fails with $st->{fails}")
				  or diag($err);
			}
			else
			{
				unlike($err, qr/\b(ERROR|FATAL|WARNING|PANIC):/, $name)
				  or diag($err);
			}
		}
	}
}

# ------------------------------------------------------------------------
# What "Uninstall" says: after DROP EXTENSION, the keys stay until a
# restart (an extension created again sees them), and a trigger that calls
# invalidate() fails; without the library the server starts.
# ------------------------------------------------------------------------

is( $node->safe_psql(
		$dbname,
		"SELECT count(*) FROM pg_extension WHERE extname = 'projcache'"),
	'0',
	"Uninstall dropped the extension in $dbname");

$node->safe_psql($dbname, 'CREATE EXTENSION projcache');
is( $node->safe_psql(
		$dbname,
		"SELECT state FROM projcache.entries WHERE key = 'acme'"),
	'enabled',
	'an extension created again sees the keys cached before');

# Every column of the three views is defined, one table row each, in the
# view's order (the table after "`projcache.VIEW`, one row ...", in the
# README or a page).
for my $view (qw(entries stats snapshots))
{
	my @documented;
	my $where;
	for my $file ('README.md', @pages)
	{
		my $in = 0;
		for my $line (@{ $file_lines{$file} })
		{
			if (!$in)
			{
				$in = 1 if $line =~ /^`projcache\.$view`, one row/;
				next;
			}
			next if $line =~ /^\| (column|---) / || ($line eq '' && !@documented);
			last unless $line =~ /^\| `(\w+)` \|/;
			push @documented, $1;
		}
		if ($in)
		{
			$where = $file;
			last;
		}
	}
	ok(defined $where, "a page has the columns table of projcache.$view");
	my @columns = split /\n/,
	  $node->safe_psql(
		$dbname, qq{
SELECT attname FROM pg_attribute
 WHERE attrelid = 'projcache.$view'::regclass AND attnum > 0 AND NOT attisdropped
 ORDER BY attnum});
	is_deeply(\@columns, \@documented,
		($where // 'the pages') . " defines every column of projcache.$view, in order");
}

$node->safe_psql(
	$dbname, q{
CREATE TABLE public.uninstall_probe (key text);
CREATE FUNCTION public.uninstall_probe_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM projcache.invalidate(NEW.key);
    RETURN NULL;
END $$;
CREATE TRIGGER uninstall_probe AFTER INSERT ON public.uninstall_probe
    FOR EACH ROW EXECUTE FUNCTION public.uninstall_probe_changed();
INSERT INTO public.uninstall_probe VALUES ('acme');
DROP EXTENSION projcache;
});
my ($stdout, $stderr);
$node->psql(
	$dbname,
	"\\set VERBOSITY verbose\nINSERT INTO public.uninstall_probe VALUES ('acme');",
	stdout => \$stdout,
	stderr => \$stderr);
like(
	$stderr,
	qr/ERROR:  42883: function projcache\.invalidate\(text\) does not exist/,
	'after DROP EXTENSION, a trigger calling invalidate() fails with 42883');

# Take the Install lines out of postgresql.conf, and restart.
my $conf_file = $node->data_dir . '/postgresql.conf';
my $conf_text = slurp_file($conf_file);
for my $l (grep { /\S/ } split /\n/, $conf)
{
	$conf_text =~ s/^\Q$l\E\n//m
	  or BAIL_OUT("postgresql.conf lost the line: $l");
}
open(my $fh, '>', $conf_file) or die "could not write $conf_file: $!";
print $fh $conf_text;
close $fh;
$node->restart;
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'projcache%'"),
	'0',
	'without the library, the server runs no projcache worker');
$node->psql(
	$dbname, "\\set VERBOSITY verbose\nCREATE EXTENSION projcache;",
	stdout => \$stdout,
	stderr => \$stderr);
like($stderr, qr/ERROR:  55000: projcache must be loaded via shared_preload_libraries/,
	'and CREATE EXTENSION projcache fails with 55000');

$node->stop;
done_testing();
