# Copyright (c) 2026, projcache developers
#
# The README, run as written.  Every block of README.md fenced as ```sql
# runs, in order, on a new server set up as its Install section says, so
# that each example works when pasted on a fresh server.
#
# The server: the first ```ini block of "## Install" is appended to
# postgresql.conf as it is (no test clock, no other projcache setting), and
# the database that the first ```sh block there creates (`createdb NAME`)
# is created; it must be the projcache.database of that ini block.
#
# Conventions of the README's SQL blocks (the README says the same, under
# "Install" and "Tests"):
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
# markers.  Nothing here sleeps: where a block needs the worker, the README
# waits itself (get(key, '5s')).
#
# After the last block, the claims of the README's "Uninstall" section are
# checked: a trigger that calls invalidate() fails with 42883 once the
# extension is dropped; an extension created again before a restart sees
# the keys cached before; the server starts without the library (and
# CREATE EXTENSION then fails with 55000).  And the README's tables of the
# columns of projcache.entries, stats and snapshots are checked against
# the views, column by column.

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ProjcacheTest;
use Test::More;

my $readme_path = "$FindBin::RealBin/../../README.md";
my @readme = split /\n/, slurp_file($readme_path), -1;

# ------------------------------------------------------------------------
# The fenced blocks of the README, with their language, section and line.
# ------------------------------------------------------------------------

my @blocks;
{
	my $section = '';
	my $open;
	for my $i (0 .. $#readme)
	{
		my $line = $readme[$i];
		if (!$open)
		{
			if ($line =~ /^## (.*\S)/)
			{
				$section = $1;
			}
			elsif ($line =~ /^( *)(`{3,})([\w-]*)\s*$/)
			{
				$open = {
					indent => length($1),
					fence => length($2),
					lang => $3,
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
	BAIL_OUT("README.md: a code block opened at line $open->{line} is not closed")
	  if $open;
}
my @sql_blocks = grep { $_->{lang} eq 'sql' } @blocks;
ok(scalar(@sql_blocks) > 0, 'README.md has sql blocks: ' . scalar(@sql_blocks));

# ------------------------------------------------------------------------
# The server, as the Install section says.
# ------------------------------------------------------------------------

my @install = grep { $_->{section} eq 'Install' } @blocks;
my ($conf_block) = grep { $_->{lang} eq 'ini' } @install;
my ($sh_block) = grep { $_->{lang} eq 'sh' && $_->{text} =~ /\bcreatedb\b/ }
  @install;
BAIL_OUT('README.md: no ```ini block (postgresql.conf) in "## Install"')
  unless $conf_block;
BAIL_OUT('README.md: no ```sh block with createdb in "## Install"')
  unless $sh_block;

my $conf = $conf_block->{text};
like($conf, qr/^shared_preload_libraries = 'projcache'/m,
	'Install: postgresql.conf preloads projcache');
my ($dbname) = $conf =~ /^projcache\.database = '(\w+)'/m;
ok(defined $dbname, 'Install: postgresql.conf sets projcache.database');
my ($created) = $sh_block->{text} =~ /\bcreatedb\s+(\w+)/;
is($created, $dbname, 'Install: createdb creates projcache.database');
BAIL_OUT('README.md: the Install section does not name its database')
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
# the statement's first line of code in README.md.
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
	my $where = "README.md:$block->{line}";
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
			my $name = "README.md:$st->{line}: " . first_code_line($st->{text});
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
	"the README's Uninstall dropped the extension in $dbname");

$node->safe_psql($dbname, 'CREATE EXTENSION projcache');
is( $node->safe_psql(
		$dbname,
		"SELECT state FROM projcache.entries WHERE key = 'acme'"),
	'enabled',
	'an extension created again sees the keys cached before');

# Every column of the three views is defined in the README, one table
# row each, in the view's order (the tables after "`projcache.VIEW`, one
# row ...").
for my $view (qw(entries stats snapshots))
{
	my @documented;
	my $in = 0;
	for my $line (@readme)
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
	my @columns = split /\n/,
	  $node->safe_psql(
		$dbname, qq{
SELECT attname FROM pg_attribute
 WHERE attrelid = 'projcache.$view'::regclass AND attnum > 0 AND NOT attisdropped
 ORDER BY attnum});
	is_deeply(\@columns, \@documented,
		"README defines every column of projcache.$view, in order");
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
