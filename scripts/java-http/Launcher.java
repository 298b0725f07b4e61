/*
 * Runs Java BookKeeper's bookie (org.apache.bookkeeper.server.Main; -Dmain=autorecovery: its
 * AutoRecoveryMain, which serves the same API) with its admin HTTP API served by
 * Jetty through BookKeeper's own servlet adapter (bookkeeper-http/servlet-http-server), for builds that
 * have no Vert.x: the bookie's configuration sets
 * httpServerClass=org.apache.bookkeeper.http.servlet.BookieServletHttpServer, which only holds the
 * bookie's HttpServiceProvider, and this launcher listens on -Dhttp.port (host -Dhttp.host, default
 * 127.0.0.1) with BookieHttpServiceServlet. The one change over the servlet: a path HttpRouter does not
 * bind answers 404, as Vert.x's router does in the default build (the servlet alone fails it with 500).
 *
 * Compiled at run time by scripts/java-interop-admin into a temporary directory; never part of bkctl.
 */

import java.io.IOException;
import java.util.HashSet;
import java.util.Set;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.apache.bookkeeper.http.AbstractHttpHandlerFactory;
import org.apache.bookkeeper.http.HttpRouter;
import org.apache.bookkeeper.http.HttpServer.ApiType;
import org.apache.bookkeeper.http.servlet.BookieHttpServiceServlet;
import org.apache.bookkeeper.http.servlet.BookieServletHttpServer;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public final class Launcher {
    private Launcher() {}

    /** BookKeeper's servlet, with Vert.x's 404 for the paths its router has no handler for. */
    static final class RoutedServlet extends BookieHttpServiceServlet {
        private static final long serialVersionUID = 1L;
        private final Set<String> paths = new HashSet<>();

        RoutedServlet() {
            new HttpRouter<ApiType>(new AbstractHttpHandlerFactory<ApiType>(null) {
                @Override
                public ApiType newHandler(ApiType type) {
                    return type;
                }
            }) {
                @Override
                public void bindHandler(String endpoint, ApiType type) {
                    paths.add(endpoint);
                }
            }.bindAll();
        }

        @Override
        protected void service(HttpServletRequest request, HttpServletResponse response) throws IOException {
            if (!paths.contains(request.getRequestURI())) {
                response.sendError(HttpServletResponse.SC_NOT_FOUND);
                return;
            }
            super.service(request, response);
        }
    }

    public static void main(String[] args) throws Exception {
        Server jetty = new Server();
        ServerConnector connector = new ServerConnector(jetty);
        connector.setHost(System.getProperty("http.host", "127.0.0.1"));
        connector.setPort(Integer.getInteger("http.port", 8000));
        jetty.addConnector(connector);
        ServletContextHandler context = new ServletContextHandler();
        context.setContextPath("/");
        context.addServlet(new ServletHolder(new RoutedServlet()), "/*");
        jetty.setHandler(context);
        jetty.start();
        System.err.println("Launcher: HTTP on " + connector.getHost() + ":" + connector.getLocalPort()
            + ", provider class " + BookieServletHttpServer.class.getName());
        if ("autorecovery".equals(System.getProperty("main"))) {
            org.apache.bookkeeper.replication.AutoRecoveryMain.main(args);
        } else {
            org.apache.bookkeeper.server.Main.main(args);
        }
    }
}
